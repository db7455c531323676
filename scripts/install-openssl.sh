#!/usr/bin/env bash
# Installs Debian's openssl command for the client suites, whose harnesses make the CA and the
# certificates of their TLS and mTLS tests with it (scripts/make-test-certs.sh); does nothing
# when it is already there.
set -euo pipefail
if command -v openssl >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends openssl >/dev/null
