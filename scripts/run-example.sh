#!/usr/bin/env bash
# Installs the dependencies, builds tsnap and runs the training demo: a transformer trained with
# periodic snapshots, preempted by SIGTERM, restarted and resumed, with its loss curve compared
# bit for bit against an uninterrupted run (about a minute and a half on 2 cores).
# Arguments are passed to the demo (e.g. --steps 200 --every 20 --dir /path/to/keep/snapshots).
# `scripts/run-example.sh ddp [args]` runs the data-parallel demo instead (2 processes, Gloo,
# distributed snapshots, resume on 2 ranks and on 1 process).
#   TSNAP_TORCH=wheel  (default) LibTorch 2.x from the torch wheel, in build/
#   TSNAP_TORCH=debian Debian's LibTorch 1.13, in build-debian/
# JOBS=N overrides the build parallelism (default: nproc).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kind="${TSNAP_TORCH:-wheel}"
default_dir="$repo/build"
if [[ "$kind" == debian ]]; then default_dir="$repo/build-debian"; fi
build_dir="${TSNAP_BUILD_DIR:-$default_dir}"
if [[ "${1:-}" == ddp ]]; then
  shift
  "$repo/scripts/build.sh" tsnap_example_train_ddp
  exec "$build_dir/examples/tsnap_example_train_ddp" "$@"
fi
"$repo/scripts/build.sh" tsnap_example_train tsnap_example_save_load tsnap_cli
"$build_dir/examples/tsnap_example_train" "$@"
