#!/usr/bin/env bash
# Builds the project's Dockerfile into the image fencegate:local with buildah, on machines without
# a Docker engine or a registry: the two base images the Dockerfile starts from are made locally.
#
#   scripts/image.sh            # as root; installs buildah and debootstrap from Debian if missing
#
# - localhost/fencegate-runtime-base:bookworm: a minimal Debian bookworm made by debootstrap from the
#   archive apt already uses (stands in for debian:bookworm-slim);
# - localhost/fencegate-build-base:bookworm: the same, with a C toolchain, this machine's Rust
#   toolchain (`rustc --print sysroot`, documentation left out) and the certificate authorities
#   this machine added (/usr/local/share/ca-certificates) (stands in for rust:1-bookworm).
# Both are made once and reused (delete them with `buildah rmi` to remake them); the project's
# image is rebuilt each run, from the Dockerfile as users build it, only the bases swapped through
# its BUILD_IMAGE / RUNTIME_IMAGE arguments. Containers storage: vfs (no overlay mounts needed).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
RUNTIME_BASE=localhost/fencegate-runtime-base:$SUITE
BUILD_BASE=localhost/fencegate-build-base:$SUITE
TAG=${IMAGE_TAG:-fencegate:local}
export STORAGE_DRIVER=vfs

if [ "$(id -u)" != 0 ]; then
  echo "scripts/image.sh: run as root (debootstrap and buildah's chroot isolation need it)" >&2
  exit 1
fi
missing=()
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (Debian)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

have_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# commit_rootfs DIR IMAGE: an image whose only layer is DIR.
commit_rootfs() {
  local dir=$1 image=$2 container mount
  container=$(buildah from scratch)
  mount=$(buildah mount "$container")
  cp -a "$dir"/. "$mount"/
  buildah umount "$container" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$container"
  buildah commit -q "$container" "$image" >/dev/null
  buildah rm "$container" >/dev/null
}

if ! have_image "$RUNTIME_BASE"; then
  echo "making $RUNTIME_BASE (debootstrap --variant=minbase $SUITE)"
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase "$SUITE" "$rootfs" "$MIRROR" >/dev/null
  # As the slim image: no package lists kept.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
  commit_rootfs "$rootfs" "$RUNTIME_BASE"
  rm -rf "$rootfs"
  trap - EXIT
fi

if ! have_image "$BUILD_BASE"; then
  echo "making $BUILD_BASE (gcc, and the Rust toolchain at $(rustc --print sysroot))"
  sysroot=$(rustc --print sysroot)
  container=$(buildah from "$RUNTIME_BASE")
  buildah run --isolation chroot "$container" -- sh -c \
    'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev ca-certificates pkg-config >/dev/null && rm -rf /var/lib/apt/lists/*'
  mount=$(buildah mount "$container")
  mkdir -p "$mount/usr/local/rust"
  tar -C "$sysroot" --exclude=./share/doc -cf - . | tar -C "$mount/usr/local/rust" -xf -
  # The build stage fetches crates: it trusts the certificate authorities this machine added to
  # its own (an egress proxy's, for one). Only the build base; the runtime image stays as built.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$mount/usr/local/share/ca-certificates/"
  fi
  buildah umount "$container" >/dev/null
  buildah run --isolation chroot "$container" -- update-ca-certificates >/dev/null
  buildah config --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/rust/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "$container"
  buildah commit -q "$container" "$BUILD_BASE" >/dev/null
  buildah rm "$container" >/dev/null
fi

echo "building $TAG from Dockerfile (bases: $BUILD_BASE, $RUNTIME_BASE)"
# Docker's image format: OCI's has no HEALTHCHECK (buildah drops it with a warning).
buildah bud --format docker --isolation chroot --layers \
  --build-arg BUILD_IMAGE="$BUILD_BASE" --build-arg RUNTIME_IMAGE="$RUNTIME_BASE" \
  -t "$TAG" -f Dockerfile .
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$TAG"
