#!/usr/bin/env bash
# Installs Debian's systemd for `systemd-analyze`, which checks deploy/systemd/rota.service;
# does nothing when it is already there. Only the analyzer is used: no unit is started.
set -euo pipefail
if command -v systemd-analyze >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends systemd >/dev/null
