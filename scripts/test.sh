#!/usr/bin/env bash
# Installs the dependencies, builds tsnap in build/ and runs the fast unit tests.
# JOBS=N overrides the build parallelism (default: nproc).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/install-deps.sh"

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}"
cmake --build "$repo/build" -j "${JOBS:-$(nproc)}"
ctest --test-dir "$repo/build" -L unit --output-on-failure -j2
