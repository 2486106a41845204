#!/usr/bin/env bash
# Installs the dependencies and builds tsnap (Ninja, RelWithDebInfo, ccache when present).
# Arguments are build targets (none: everything).
#   TSNAP_TORCH=wheel  (default) against LibTorch 2.x from the torch wheel (.venv/), in build/
#   TSNAP_TORCH=debian against Debian's libtorch-dev 1.13, in build-debian/
# TSNAP_BUILD_DIR overrides the build directory, JOBS=N the parallelism (a LibTorch translation
# unit takes about 1 GB to compile), TSNAP_CMAKE_ARGS adds configure arguments (split on spaces;
# scripts/sanitize.sh and scripts/fuzz.sh use it) and CXX picks the compiler of a new build
# directory (CMake's own rule).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kind="${TSNAP_TORCH:-wheel}"
case "$kind" in
  wheel) build_dir="${TSNAP_BUILD_DIR:-$repo/build}" ;;
  debian) build_dir="${TSNAP_BUILD_DIR:-$repo/build-debian}" ;;
  *) echo "build: TSNAP_TORCH must be wheel or debian, not '$kind'" >&2; exit 2 ;;
esac
TSNAP_TORCH="$kind" "$repo/scripts/install-deps.sh"

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Paths under the checkout are hashed relative to it, and not the build directory (which -g
  # would add): another clone (CI's) reuses the cache.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$repo}"
  export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
fi
extra=()
if [[ -n "${TSNAP_CMAKE_ARGS:-}" ]]; then read -ra extra <<<"$TSNAP_CMAKE_ARGS"; fi
cmake -S "$repo" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTSNAP_TORCH="$kind" \
  "${launcher[@]}" "${extra[@]}" | grep -E "^-- tsnap:|Error|error" || true
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}" "${targets[@]}"
