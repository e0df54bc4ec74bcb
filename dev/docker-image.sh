#!/usr/bin/env bash
# Build servesweep's test image from a local rootfs tarball and `docker import` it.
# Nothing is pulled from a registry.
#
#   dev/docker-image.sh [TAG]        default TAG: servesweep-host:local
#
# Talks to the engine in $DOCKER_HOST (e.g. the one of dev/dockerd.sh). The image is
# a skeleton of a few kilobytes: /bin, /lib, /lib64, /sbin as links into /usr, empty
# /usr, /proc, /sys, /dev, /tmp, /root, /run and a minimal /etc. A container of it
# runs the host's programs once the host's /usr (and the Python installation, the
# venv and the checkout, wherever they live) are bound read-only at run time:
#
#   docker run --rm -v /usr:/usr:ro -v "$PREFIX:$PREFIX:ro" -v "$REPO:$REPO:ro" \
#       servesweep-host:local "$REPO/.venv/bin/python" -m servesweep.sim ...
#
# The tarball is cached in ${SERVESWEEP_CACHE:-$HOME/.cache/servesweep}/; the import is
# skipped when the engine already has TAG from the same tarball (same digest label).
set -euo pipefail

tag=${1:-servesweep-host:local}
cache=${SERVESWEEP_CACHE:-$HOME/.cache/servesweep}
tarball="$cache/host-rootfs.tar"
mkdir -p "$cache"

if [ ! -s "$tarball" ]; then
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    mkdir -p "$root"/{usr,proc,sys,dev,tmp,root,run,etc,var/tmp,opt,srv,home,work}
    chmod 1777 "$root/tmp" "$root/var/tmp"
    chmod 700 "$root/root"
    for d in bin lib lib64 sbin; do ln -s "usr/$d" "$root/$d"; done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
    printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
    # Fixed owner and mtime: the same tarball, byte for byte, on every machine.
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
        -C "$root" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
fi

digest=$(sha256sum "$tarball" | cut -c1-16)
have=$(docker image inspect --format '{{index .Config.Labels "servesweep.rootfs"}}' "$tag" 2>/dev/null || true)
if [ "$have" != "$digest" ]; then
    docker import --change "LABEL servesweep.rootfs=$digest" \
        --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' \
        "$tarball" "$tag" >/dev/null
fi
echo "$tag"
