#!/usr/bin/env bash
# Build the pipeline's Apptainer images from their definition files:
#
#   containers/build.sh cuda        -> apptainer build containers/images/cuda.sif containers/cuda.def
#   containers/build.sh rocm        -> apptainer build containers/images/rocm.sif containers/rocm.def
#   containers/build.sh             -> both
#   containers/build.sh -n cuda     -> print the command only
#
# Run it on a machine with Apptainer >= 1.1 (https://apptainer.org; not packaged for Debian 12 or PyPI), as root
# or, unprivileged, with --fakeroot (added automatically when not root). It works from any directory: it changes
# to the repository root because the .def files copy envs/requirements.txt by a path relative to it. Expect
# ~20-30 GB of temporary space (set APPTAINER_TMPDIR / APPTAINER_CACHEDIR to a large disk) and 20-60 minutes:
# the DeepSpeed ops compile at build time. The images go to containers/images/ (git-ignored); config.yaml's
# `containers:` section names them per platform, and every rule uses them under --use-apptainer:
#
#   snakemake --profile profiles/local-cuda --use-apptainer --configfile studies/<study>.yaml
#
# Check a built image: apptainer test containers/images/cuda.sif ; apptainer inspect --labels <image>
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=0
if [ "${1:-}" = "-n" ]; then dry_run=1; shift; fi
platforms=("$@")
[ ${#platforms[@]} -gt 0 ] || platforms=(cuda rocm)

build_args=()
if [ "$(id -u)" != 0 ]; then build_args+=(--fakeroot); fi

for platform in "${platforms[@]}"; do
  def="containers/${platform}.def"
  [ -f "$def" ] || { echo "no definition file $def (platforms: cuda, rocm)" >&2; exit 2; }
  cmd=(apptainer build "${build_args[@]}" "containers/images/${platform}.sif" "$def")
  echo "+ ${cmd[*]}"
  if [ "$dry_run" = 0 ]; then
    command -v apptainer >/dev/null || { echo "apptainer not found: install Apptainer >= 1.1 first" >&2; exit 127; }
    mkdir -p containers/images
    "${cmd[@]}"
  fi
done
