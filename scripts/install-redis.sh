#!/usr/bin/env bash
# Installs Debian's redis-server, redis-sentinel and redis-tools (redis-cli, which builds the
# tests' Redis Cluster) for the shared-state tests; does nothing when all are already there.
# The tests start their own servers on free loopback ports.
set -euo pipefail
if command -v redis-server >/dev/null && command -v redis-sentinel >/dev/null && command -v redis-cli >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-sentinel redis-tools >/dev/null
