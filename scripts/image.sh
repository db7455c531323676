#!/usr/bin/env bash
# Builds rota's container image with podman: a release build of `rota` on the host, copied into
# a Debian bookworm slim base (Containerfile at the repository root), tagged
# localhost/rota:VERSION and localhost/rota:latest.
#
#   scripts/image.sh                 build the image
#   ROTA_IMAGE=NAME:TAG scripts/image.sh   another tag
#
# The base is ROTA_IMAGE_BASE (default docker.io/library/debian:bookworm-slim). When podman
# does not have it and mmdebstrap is installed, it is built here from Debian's package mirror
# (`mmdebstrap --variant=minbase bookworm`, without manuals and locales) and imported under
# that name, so no container registry is needed; otherwise podman pulls it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
image="${ROTA_IMAGE:-localhost/rota:$version}"
base="${ROTA_IMAGE_BASE:-docker.io/library/debian:bookworm-slim}"
mirror="${ROTA_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

cargo build --locked --release --bin rota

if ! podman image exists "$base"; then
  if command -v mmdebstrap >/dev/null; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    echo "scripts/image.sh: building the base $base with mmdebstrap from $mirror" >&2
    mmdebstrap --quiet --variant=minbase \
      --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      bookworm "$work/rootfs.tar" "$mirror"
    podman import --quiet --change 'CMD ["bash"]' "$work/rootfs.tar" "$base" >/dev/null
    rm -f "$work/rootfs.tar"
  else
    podman pull "$base"
  fi
fi

# The build context holds only what the image needs. The release profile keeps line tables
# for backtraces (100 MB of the binary's 130): the image takes the binary without them
# (symbols stay, so a backtrace still names its functions).
context="$(mktemp -d)"
trap 'rm -rf "$context" ${work:+"$work"}' EXIT
objcopy --strip-debug "$target_dir/release/rota" "$context/rota"
cp deploy/image/rota.toml "$context/rota.toml"
podman build --quiet --pull=never --build-arg "BASE=$base" -f Containerfile \
  -t "$image" -t "${image%:*}:latest" "$context" >/dev/null
echo "$image"
