#!/usr/bin/env bash
# Installs the dependencies, builds tsnap in build/ and runs the save/load example.
# Arguments are passed to the example (e.g. --mb 100, --dir /path/to/keep/snapshots).
# JOBS=N overrides the build parallelism (default: nproc).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/install-deps.sh"

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}"
cmake --build "$repo/build" -j "${JOBS:-$(nproc)}" --target tsnap_example_save_load tsnap_cli
"$repo/build/examples/tsnap_example_save_load" "$@"
