#!/bin/sh
# The base image `make image` builds on when no registry is reachable: a
# minimal Debian bookworm rootfs made with debootstrap from Debian's mirrors,
# slimmed like debian:bookworm-slim (no apt lists, .debs, docs, man pages,
# locales) and imported with `podman import`. Cached twice: the image itself
# (nothing runs when it exists) and the rootfs tarball under CACHE (a removed
# image is re-imported in seconds, without debootstrap).
#
#   docker/base_image.sh IMAGE CACHE [MIRROR]
#
# With registry access none of this is needed: `make image BASE_IMAGE=debian:bookworm-slim`.
set -eu
image=$1
cache=$2
mirror=${3:-http://deb.debian.org/debian}
podman=${PODMAN:-podman}

if $podman image exists "$image"; then
	exit 0
fi
tarball=$cache/bookworm-slim-rootfs.tar
if [ ! -s "$tarball" ]; then
	if ! command -v debootstrap >/dev/null 2>&1; then
		echo "installing system packages: debootstrap"
		if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
		$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq debootstrap
	fi
	mkdir -p "$cache"
	rootfs=$cache/rootfs.tmp
	rm -rf "$rootfs"
	echo "debootstrap bookworm (minbase) into $rootfs"
	debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
		tail -20 "$cache/debootstrap.log"
		exit 1
	}
	rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
		"$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
		"$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
	find "$rootfs"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
	tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
	mv "$tarball.tmp" "$tarball"
	rm -rf "$rootfs"
fi
echo "podman import $tarball as $image"
$podman import -q --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change 'CMD ["/bin/bash"]' "$tarball" "$image" >/dev/null
