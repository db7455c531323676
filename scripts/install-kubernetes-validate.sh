#!/usr/bin/env bash
# Installs the PyPI package kubernetes-validate (pinned), which ships the Kubernetes API's JSON
# schemas inside it, into the virtual environment target/tools/kv-venv for the chart test
# (deploy/test/helm.sh); does nothing when that version is already there. Its schemas need no
# download at run time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version=1.37.0
venv="$root/target/tools/kv-venv"
if [ -x "$venv/bin/kubernetes-validate" ] && [ "$("$venv/bin/kubernetes-validate" --version 2>/dev/null)" = "$version" ]; then
  exit 0
fi
mkdir -p "$root/target/tools"
python3 -m venv "$venv"
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 "$venv/bin/pip" install --quiet "kubernetes-validate==$version"
