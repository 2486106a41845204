#!/usr/bin/env bash
# Installs the dependencies, builds tsnap in build/ and runs the fast unit tests.
# JOBS=N overrides the build parallelism (default: nproc).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/build.sh"
ctest --test-dir "$repo/build" -L unit --output-on-failure -j2
