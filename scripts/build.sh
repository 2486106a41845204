#!/usr/bin/env bash
# Installs the dependencies and builds tsnap in build/ (Ninja, RelWithDebInfo, ccache when
# present). Arguments are build targets (none: everything). JOBS=N overrides the parallelism.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/install-deps.sh"

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}"
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$repo/build" -j "${JOBS:-$(nproc)}" "${targets[@]}"
