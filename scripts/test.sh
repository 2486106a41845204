#!/usr/bin/env bash
# Installs the dependencies, builds tsnap and runs the fast unit tests (ctest label `unit`).
#   TSNAP_TORCH=wheel  (default) LibTorch 2.x from the torch wheel, in build/
#   TSNAP_TORCH=debian Debian's LibTorch 1.13, in build-debian/
# Extra arguments go to ctest (e.g. -L crash instead of the unit label: scripts/test.sh -L crash).
# JOBS=N overrides the build parallelism (default: nproc).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kind="${TSNAP_TORCH:-wheel}"
"$repo/scripts/build.sh"
default_dir="$repo/build"
if [[ "$kind" == debian ]]; then default_dir="$repo/build-debian"; fi
build_dir="${TSNAP_BUILD_DIR:-$default_dir}"
labels=(-L unit)
if (($# > 0)); then labels=("$@"); fi
ctest --test-dir "$build_dir" "${labels[@]}" --output-on-failure -j2
