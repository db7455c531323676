#!/usr/bin/env bash
# Checks the Helm chart deploy/helm/rota and the manifests rendered from it:
#   1. `helm lint --strict` with each values file in deploy/helm/rota/ci;
#   2. values rota would refuse at start are refused when rendering, with what to set instead;
#   3. every object `helm template` renders (each ci values file, and deploy/kubernetes) passes
#      kubernetes-validate --strict against the Kubernetes API schemas of the oldest and newest
#      versions the chart supports (1.25 and 1.37, shipped inside the PyPI package);
#      ServiceMonitor, a custom resource with no schema there, is decoded strictly into the
#      Prometheus Operator's own Go types instead (deploy/test/servicemonitor);
#   4. the rota.toml of each rendered ConfigMap is accepted by `rota serve --print-config`,
#      with its token and TLS files made in a temporary folder;
#   5. deploy/kubernetes/rota.yaml is what deploy/kubernetes/render.sh writes today.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export HELM="$root/target/tools/bin/helm"
kv="$root/target/tools/kv-venv/bin"
rota="${ROTA_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/rota}"
chart=deploy/helm/rota
fail() { echo "deploy/test/helm.sh: $*" >&2; exit 1; }
[ -x "$rota" ] || fail "no rota binary at $rota"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(
  cd deploy/test/servicemonitor
  [ -z "$(gofmt -l .)" ] || fail "gofmt: $(gofmt -l .)"
  go vet ./...
  go build -o "$work/servicemonitor" .
)

# 1.
values_files=("$chart"/ci/*-values.yaml)
for values in "${values_files[@]}"; do
  "$HELM" lint --strict --quiet "$chart" -f "$values" >"$work/lint.txt" 2>&1 \
    || fail "helm lint with $values: $(cat "$work/lint.txt")"
done

# 2. Each refused case: the --set arguments, then the words the refusal must hold.
refused() {
  local expected="$1" output
  shift
  if output="$("$HELM" template rota "$chart" "$@" 2>&1)"; then
    fail "rendered although it should be refused: $*"
  fi
  grep -qF -- "$expected" <<<"$output" || fail "refusal of '$*' does not say '$expected': $output"
}
refused "refuses to start without tokens"
refused "needs a shared state" --set insecure=true --set replicaCount=3
refused "needs a value of at least 16 characters" --set 'auth.tokens[0].name=a' --set 'auth.tokens[0].scopes={pick}' --set 'auth.tokens[0].value=short'
refused "has no scopes" --set 'auth.existingSecret=s' --set 'auth.tokens[0].name=a'
refused "must be letters, digits" --set 'auth.existingSecret=s' --set 'auth.tokens[0].name=../a' --set 'auth.tokens[0].scopes={pick}'
refused "set by the chart" --set insecure=true --set server.listen=0.0.0.0:1
refused "tls.clientCASecret needs tls.secretName" --set insecure=true --set tls.clientCASecret=ca
refused "metrics.serviceMonitor needs a token" --set insecure=true --set metrics.serviceMonitor.enabled=true

# 3. and 4.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=rota \
  -keyout "$work/tls.key" -out "$work/tls.crt" >/dev/null 2>&1
renders=()
for values in "${values_files[@]}" deploy/kubernetes/values.yaml; do
  out="$work/$(basename "$(dirname "$values")")-$(basename "$values" .yaml).yaml"
  "$HELM" template rota "$chart" --namespace rota -f "$values" >"$out"
  renders+=("$out")
done
passed=0
for version in 1.25.0 1.37.0; do
  "$kv/kubernetes-validate" --strict --kubernetes-version "$version" "${renders[@]}" >"$work/validate.txt" 2>&1 \
    || fail "kubernetes-validate $version: $(cat "$work/validate.txt")"
  # A kind without a schema is only a warning there; only ServiceMonitor may have none.
  if grep -v "Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1" "$work/validate.txt" \
    | grep -E '^(WARN|ERROR|INFO.*fail)'; then
    fail "kubernetes-validate $version: $(cat "$work/validate.txt")"
  fi
  passed=$((passed + $(grep -c '^INFO .* passed for resource' "$work/validate.txt")))
done
[ "$passed" -ge 20 ] || fail "kubernetes-validate passed only $passed objects: $(cat "$work/validate.txt")"
monitors=0
for render in "${renders[@]}"; do
  checked="$("$work/servicemonitor" <"$render")" || fail "$render: ServiceMonitor refused"
  monitors=$((monitors + ${checked%% *}))
done
[ "$monitors" -ge 2 ] || fail "only $monitors ServiceMonitor rendered; ci values enable two"

for render in "${renders[@]}"; do
  config="$work/config"
  rm -rf "$config" && mkdir -p "$config/tokens" "$config/tls" "$config/client-ca"
  "$kv/python" - "$render" "$config" <<'PY'
import sys, yaml
render, config = sys.argv[1], sys.argv[2]
maps = [d for d in yaml.safe_load_all(open(render)) if d and d["kind"] == "ConfigMap"]
assert len(maps) == 1, f"{render}: {len(maps)} ConfigMaps"
open(f"{config}/rota.toml", "w").write(maps[0]["data"]["rota.toml"].replace("/etc/rota/", config + "/"))
PY
  sed -n 's/^token_file = ".*\/tokens\/\(.*\)"$/\1/p' "$config/rota.toml" | while read -r token; do
    echo "token-for-$token-0123456789" >"$config/tokens/$token"
  done
  cp "$work/tls.crt" "$config/tls/tls.crt" && cp "$work/tls.key" "$config/tls/tls.key"
  cp "$work/tls.crt" "$config/client-ca/ca.crt"
  env -u ROTA_LISTEN -u ROTA_ADMIN_LISTEN -u ROTA_STATE -u ROTA_CONFIG \
    "$rota" serve --config "$config/rota.toml" --print-config >"$work/print-config.txt" 2>&1 \
    || fail "rota refuses the rota.toml of $render: $(cat "$work/print-config.txt")"
done

# 5.
deploy/kubernetes/render.sh - >"$work/rota.yaml"
diff -u deploy/kubernetes/rota.yaml "$work/rota.yaml" >&2 \
  || fail "deploy/kubernetes/rota.yaml is out of date: run deploy/kubernetes/render.sh"
echo "chart: ${#values_files[@]} values files linted, ${#renders[@]} renders: $passed objects valid in Kubernetes 1.25 and 1.37, $monitors ServiceMonitor valid, every rota.toml accepted by rota"
