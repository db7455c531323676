#!/usr/bin/env bash
# Installs Debian's prometheus package for its `promtool`, which checks rota's `/metrics`
# exposition and the alert rules in deploy/prometheus; does nothing when promtool is there.
# The package's own server is not started by the tests.
set -euo pipefail
if command -v promtool >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
