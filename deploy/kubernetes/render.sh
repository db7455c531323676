#!/usr/bin/env bash
# Writes deploy/kubernetes/rota.yaml: the chart deploy/helm/rota rendered with values.yaml here,
# for `kubectl apply` without Helm. deploy/test/helm.sh fails when the file differs from what
# this script writes; run it after changing the chart.
#
#   deploy/kubernetes/render.sh           rewrite rota.yaml
#   deploy/kubernetes/render.sh -         print it instead
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
helm="${HELM:-$root/target/tools/bin/helm}"
render() {
  echo "# rota for Kubernetes without Helm: deploy/helm/rota rendered by deploy/kubernetes/render.sh"
  echo "# with deploy/kubernetes/values.yaml. Create the Secret rota-tokens first (docs/deploy.md), then"
  echo "#   kubectl create namespace rota && kubectl -n rota apply -f rota.yaml"
  "$helm" template rota "$root/deploy/helm/rota" --namespace rota -f "$root/deploy/kubernetes/values.yaml"
}
if [ "${1:-}" = - ]; then
  render
else
  render >"$root/deploy/kubernetes/rota.yaml"
fi
