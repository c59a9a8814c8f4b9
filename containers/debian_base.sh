#!/usr/bin/env bash
# A Debian bookworm base image made from Debian's archive, for machines that reach no container registry:
#   containers/debian_base.sh               -> the local image localhost/debian-base:bookworm (podman)
# debootstrap (minbase variant) into a temporary root, then imported as a one-layer image; the archive is this
# machine's own apt mirror (the first URIs:/deb line of its apt sources), or $DEBIAN_MIRROR. Reused when present.
set -euo pipefail
engine=podman
tag="localhost/debian-base:bookworm"
if "$engine" image exists "$tag" 2>/dev/null; then echo "$tag (present)"; exit 0; fi
command -v debootstrap >/dev/null || { echo "debian_base.sh: debootstrap not found (apt-get install debootstrap)" >&2; exit 127; }
mirror="${DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
fi
if [ -z "$mirror" ]; then
  mirror="$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
fi
[ -n "$mirror" ] || { echo "debian_base.sh: no Debian mirror in this machine's apt sources: set DEBIAN_MIRROR" >&2; exit 2; }
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
echo "+ debootstrap --variant=minbase bookworm <root> $mirror"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
tar -C "$root" -c . | "$engine" import - "$tag" >/dev/null
echo "$tag (made from $mirror)"
