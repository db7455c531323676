#!/usr/bin/env bash
# Builds tests/sources/etcd (the program the etcd source tests drive to register endpoints the
# way go.etcd.io/etcd/client/v3/naming/endpoints does) into target/etcd-endpoints. Go's build
# cache makes a second run quick; the modules come from the Go module proxy, pinned by go.sum.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$root/target"
cd "$root/tests/sources/etcd"
go build -o "$root/target/etcd-endpoints" ./
