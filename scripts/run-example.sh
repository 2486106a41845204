#!/usr/bin/env bash
# Installs the dependencies, builds tsnap in build/ and runs the training demo: a transformer
# trained with periodic snapshots, preempted by SIGTERM, restarted and resumed, with its loss
# curve compared bit for bit against an uninterrupted run (about a minute and a half on 2 cores).
# Arguments are passed to the demo (e.g. --steps 200 --every 20 --dir /path/to/keep/snapshots).
# JOBS=N overrides the build parallelism (default: nproc).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/install-deps.sh"

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}"
cmake --build "$repo/build" -j "${JOBS:-$(nproc)}" \
  --target tsnap_example_train tsnap_example_save_load tsnap_cli
"$repo/build/examples/tsnap_example_train" "$@"
