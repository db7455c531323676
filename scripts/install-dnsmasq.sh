#!/usr/bin/env bash
# Installs Debian's dnsmasq-base (the /usr/sbin/dnsmasq binary alone) for the DNS source tests;
# does nothing when it is already there. dnsmasq-base ships no service, so nothing is left
# listening on port 53: the tests run their own dnsmasq as the current user on a free loopback
# port (see tests/sources/dns/README.md). The package `dnsmasq` is not installed on purpose,
# since it adds a system service that binds port 53.
set -euo pipefail
if command -v dnsmasq >/dev/null || [ -x /usr/sbin/dnsmasq ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends dnsmasq-base >/dev/null
