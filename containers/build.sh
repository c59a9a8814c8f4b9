#!/usr/bin/env bash
# Build the pipeline's images from their one recipe (containers/install.sh), with whichever builder is present:
#
#   containers/build.sh cpu                  -> containers/images/cpu.sif      (apptainer, from containers/cpu.def)
#                                            or containers/images/cpu.oci.tar  (podman, from containers/Containerfile)
#   containers/build.sh cuda                 -> the NVIDIA image: Debian + PyPI only, DeepSpeed's ops compiled in
#   containers/build.sh rocm                 -> the AMD image, over the vendor's PyTorch image (from a registry)
#   containers/build.sh -n cpu               -> print the commands only
#   --engine apptainer|podman                   choose the builder (default: apptainer, else podman)
#   --base IMAGE                                podman: build over IMAGE instead (`debootstrap`: the Debian base)
#
# The base is the .def's for both builders: `Bootstrap: debootstrap` (cpu, cuda) makes Debian's OSVersion from
# Debian's archive, no container registry involved — apptainer itself (MirrorURL: the build argument DEBIAN_MIRROR,
# this machine's apt mirror or $DEBIAN_MIRROR; needs debootstrap on the build machine), for podman
# containers/debian_base.sh; a `From:` line (rocm) names a registry image. Study config `containers.<platform>: auto`
# (the default) takes containers/images/<platform>.sif, else the OCI archive, which Snakemake converts with
# `apptainer pull` on first use. On a cluster without podman the archive converts by hand too:
# apptainer build containers/images/cpu.sif oci-archive://containers/images/cpu.oci.tar
#
# podman: pip's CA bundle is mounted for the build only, never baked into the image, and for the cpu image this
# machine's pip find-links directories too (pip config: a local CPU torch wheel; the cuda image takes PyPI's CUDA
# build of the pin, so none are in reach there); containers/podman.conf is used when CONTAINERS_CONF is unset (runc,
# cgroupfs: the settings root needs on a VM without CAP_SYS_RESOURCE). apptainer: run as root or with --fakeroot
# (added when not root). The cuda image needs ~25 GB of temporary space (APPTAINER_TMPDIR; podman's storage).
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=0 engine="" base=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n) dry_run=1 ;;
    --engine) engine="$2"; shift ;;
    --base) base="$2"; shift ;;
    -*) echo "build.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
platforms=("$@")
[ ${#platforms[@]} -gt 0 ] || platforms=(cpu cuda rocm)
for platform in "${platforms[@]}"; do
  [ -f "containers/${platform}.def" ] || { echo "build.sh: no recipe for platform '$platform' (containers/${platform}.def; platforms: cpu, cuda, rocm)" >&2; exit 2; }
done

# The base of containers/<platform>.def: "debootstrap SUITE" (Bootstrap: debootstrap, OSVersion) or its From: image
def_base() {
  awk '/^%/ {exit} {key = $1; sub(/^[A-Za-z]+: */, "")} key == "Bootstrap:" {b = $0} key == "OSVersion:" {v = $0}
       key == "From:" {f = $0} END {if (b == "debootstrap") print "debootstrap " v; else print f}' "containers/$1.def"
}

real_apptainer() {  # the CI adapter (tests/adapters) answers to `apptainer` but cannot build from a .def
  command -v apptainer >/dev/null && ! apptainer --version 2>/dev/null | grep -q adapter
}
if [ -z "$engine" ]; then
  if real_apptainer; then engine=apptainer
  elif command -v podman >/dev/null; then engine=podman
  elif [ "$dry_run" = 1 ]; then engine=apptainer
  else
    echo "build.sh: no image builder found: install Apptainer >= 1.1 (clusters) or podman (apt-get install podman runc)" >&2
    exit 127
  fi
fi
case "$engine" in
  apptainer | podman) ;;
  *) echo "build.sh: unknown engine '$engine' (apptainer, podman)" >&2; exit 2 ;;
esac
if [ "$dry_run" = 0 ]; then
  command -v "$engine" >/dev/null || { echo "build.sh: $engine not found" >&2; exit 127; }
  echo "builder: $("$engine" --version | head -1)"
fi

# containers/.build/<platform>.recipe.json: the recipe's commit, copied into the image (/opt/pipeline/image.json)
write_recipe() {
  local platform="$1" base_image="$2" commit dirty
  commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
  dirty=false
  [ -n "$(git status --porcelain -- containers envs 2>/dev/null)" ] && dirty=true
  mkdir -p containers/.build
  printf '{"recipe": "containers/install.sh", "recipe_commit": "%s", "recipe_dirty": %s, "base_image": "%s", "builder": "%s", "built_at": "%s"}\n' \
    "$commit" "$dirty" "$base_image" "$engine" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "containers/.build/${platform}.recipe.json"
}

run() { echo "+ $*"; [ "$dry_run" = 1 ] || "$@"; }

fail() {  # one line naming the recipe, then the builder's own tail
  echo "build.sh: building the $1 image from $2 failed (exit $3); the builder's output is above" >&2
  exit "$3"
}

build_apptainer() {
  local platform="$1" flags=() image_base
  [ -z "$base" ] || { echo "build.sh: --base works with podman; for apptainer edit containers/${platform}.def" >&2; exit 2; }
  [ "$(id -u)" = 0 ] || flags+=(--fakeroot)
  image_base="$(def_base "$platform")"
  if [ "${image_base%% *}" = debootstrap ]; then
    local mirror
    mirror="$(containers/debian_base.sh --mirror)" || exit 2
    flags+=(--build-arg "DEBIAN_MIRROR=$mirror")
    image_base="debootstrap:${image_base#* }"
  fi
  [ "$dry_run" = 1 ] || { mkdir -p containers/images; write_recipe "$platform" "$image_base"; }
  run apptainer build "${flags[@]}" "containers/images/${platform}.sif" "containers/${platform}.def" \
    || fail "$platform" "containers/${platform}.def" $?
}

build_podman() {
  local platform="$1" image_base="$base" tag="localhost/dist-train-studies-${platform}:latest" mounts=() args=()
  local suite
  suite="$(def_base "$platform")"
  [ -n "$image_base" ] || image_base="${suite%% *}"
  if [ "$image_base" = debootstrap ]; then
    [ "${suite%% *}" = debootstrap ] || { echo "build.sh: --base debootstrap: containers/${platform}.def builds over $suite, whose torch a Debian base lacks" >&2; exit 2; }
    suite="${suite#* }"
    if [ "$dry_run" = 1 ]; then echo "+ containers/debian_base.sh $suite"; image_base="localhost/debian-base:$suite"
    else image_base="$(containers/debian_base.sh "$suite" | tail -1 | cut -d' ' -f1)"; fi
  fi
  [ -n "${CONTAINERS_CONF:-}" ] || ! command -v runc >/dev/null || export CONTAINERS_CONF="$PWD/containers/podman.conf"
  local ca=/etc/ssl/certs/ca-certificates.crt
  if [ -f "$ca" ]; then mounts+=(-v "$ca:/run/build/ca.crt:ro"); args+=(--build-arg BUILD_PIP_CERT=/run/build/ca.crt); fi
  local links="" i=0 dir find_links=""  # the cpu image only: the GPU images take PyPI's builds of torch
  [ "$platform" != cpu ] || find_links="$(python3 -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p" | sort -u)"
  for dir in $find_links; do
    [ -d "$dir" ] || continue
    mounts+=(-v "$dir:/run/build/wheels$i:ro"); links="$links /run/build/wheels$i"; i=$((i + 1))
  done
  [ -z "$links" ] || args+=(--build-arg "BUILD_PIP_FIND_LINKS=${links# }")
  [ "$dry_run" = 1 ] || { mkdir -p containers/images; write_recipe "$platform" "$image_base"; }
  local start=$SECONDS
  run podman build -f containers/Containerfile --build-arg "BASE=$image_base" --build-arg "PLATFORM=$platform" \
    "${args[@]}" "${mounts[@]}" -t "$tag" . || fail "$platform" containers/Containerfile $?
  # a new file, then a rename: a copy Snakemake converted from the old archive is older than it, and re-converted
  run podman save --format oci-archive -o "containers/images/${platform}.oci.tar.tmp" "$tag" \
    || fail "$platform" containers/Containerfile $?
  run mv "containers/images/${platform}.oci.tar.tmp" "containers/images/${platform}.oci.tar"
  if [ "$dry_run" = 0 ]; then
    echo "image: containers/images/${platform}.oci.tar ($(du -m "containers/images/${platform}.oci.tar" | cut -f1) MB," \
      "$(podman image inspect --format '{{.Size}}' "$tag" | awk '{printf "%d MB", $1 / 1e6}') unpacked)" \
      "digest $(podman image inspect --format '{{.Digest}}' "$tag"), built in $((SECONDS - start)) s with podman"
  fi
}

for platform in "${platforms[@]}"; do
  "build_$engine" "$platform"
done
