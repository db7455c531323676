#!/usr/bin/env bash
# Installs Debian's redis-server and redis-sentinel for the shared-state tests; does nothing
# when both are already there. The tests start their own servers on free loopback ports.
set -euo pipefail
if command -v redis-server >/dev/null && command -v redis-sentinel >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-sentinel >/dev/null
