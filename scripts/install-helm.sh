#!/usr/bin/env bash
# Installs Helm 4 (helm.sh/helm/v4, pinned) from the Go module proxy into target/tools/bin for
# the chart test (deploy/test/helm.sh); does nothing when that binary is already there. The
# first build takes a few minutes; Go's module and build caches make later ones quick.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version=v4.3.2
bin="$root/target/tools/bin"
if [ -x "$bin/helm" ] && go version -m "$bin/helm" | grep -qE "^\s+mod\s+helm.sh/helm/v4\s+$version\s"; then
  exit 0
fi
mkdir -p "$bin"
GOBIN="$bin" go install "helm.sh/helm/v4/cmd/helm@$version"
