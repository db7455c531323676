#!/usr/bin/env bash
# Installs Debian's podman, runc and mmdebstrap for the container image test (scripts/image.sh,
# deploy/test/image.sh); does nothing when they are already there. podman runs with runc
# and the settings of deploy/test/containers.conf, named by CONTAINERS_CONF in the test: crun,
# podman's default runtime, refuses the hybrid cgroup layout of the machines rota is tested on.
# mmdebstrap builds the Debian base image from Debian's own package mirror, so no container
# registry is needed. binutils brings objcopy, which scripts/image.sh strips the binary with.
set -euo pipefail
if command -v podman >/dev/null && command -v runc >/dev/null && command -v mmdebstrap >/dev/null && command -v objcopy >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
  podman runc mmdebstrap fuse-overlayfs uidmap ca-certificates binutils >/dev/null
