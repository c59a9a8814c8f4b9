#!/usr/bin/env bash
# A Debian base image made from Debian's archive, the base of the cpu and cuda images (their .def's
# `Bootstrap: debootstrap`; containers/build.sh passes the .def's OSVersion):
#   containers/debian_base.sh SUITE         -> the local image localhost/debian-base:SUITE (podman)
#   containers/debian_base.sh --mirror      -> print the archive it uses (apptainer's MirrorURL, from build.sh)
# debootstrap (minbase variant, as apptainer's debootstrap bootstrap) into a temporary root, then imported as a
# one-layer image; the archive is this machine's own apt mirror (the first URIs:/deb line of its apt sources), or
# $DEBIAN_MIRROR. Reused when present.
set -euo pipefail
engine=podman

mirror() {
  local found="${DEBIAN_MIRROR:-}"
  [ -n "$found" ] || found="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
  [ -n "$found" ] || found="$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
  [ -n "$found" ] || { echo "debian_base.sh: no Debian mirror in this machine's apt sources: set DEBIAN_MIRROR" >&2; exit 2; }
  echo "$found"
}

[ $# = 1 ] || { echo "usage: debian_base.sh SUITE | --mirror" >&2; exit 2; }
if [ "$1" = --mirror ]; then mirror; exit 0; fi
suite="$1"
tag="localhost/debian-base:$suite"
if "$engine" image exists "$tag" 2>/dev/null; then echo "$tag (present)"; exit 0; fi
command -v debootstrap >/dev/null || { echo "debian_base.sh: debootstrap not found (apt-get install debootstrap)" >&2; exit 127; }
archive="$(mirror)"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
echo "+ debootstrap --variant=minbase $suite <root> $archive"
debootstrap --variant=minbase "$suite" "$root" "$archive" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
tar -C "$root" -c . | "$engine" import - "$tag" >/dev/null
echo "$tag (made from $archive)"
