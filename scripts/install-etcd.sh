#!/usr/bin/env bash
# Installs Debian's etcd-server (etcd) and etcd-client (etcdctl) for the etcd source tests; does
# nothing when both are already there. The tests start their own etcd on free loopback ports
# with a temporary --data-dir. Where systemd runs, the package's own etcd service (which would
# listen on 127.0.0.1:2379) is stopped and disabled again, so that only the tests' servers run.
set -euo pipefail
if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  $SUDO systemctl disable --now etcd.service >/dev/null 2>&1 || true
fi
