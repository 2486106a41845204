#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang 14, ASan + UBSan, in build-fuzz/) and runs
# each from its seeds for the given seconds (default 60); prints execs and crashes per target
# and fails when one crashed (the input is kept under build-fuzz/tests/fuzz/<target>/artifacts/).
#   scripts/fuzz.sh [seconds-per-target]
#   scripts/fuzz.sh --seeds   rewrites the seed corpora of tests/fuzz/corpus/ made from snapshots
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$repo/build-fuzz"
targets=(fuzz_header fuzz_manifest fuzz_snapshot fuzz_s3_xml)
if [[ "${1:-}" == --seeds ]]; then targets=(tsnap_fuzz_seeds); fi

# The library's objects are those of scripts/sanitize.sh asan (cmake/Sanitizers.cmake): one of
# the two builds is ccache hits. Only the read path is fuzzed: no training-state layer.
CXX=clang++-14 TSNAP_BUILD_DIR="$build_dir" \
  TSNAP_CMAKE_ARGS="-DTSNAP_FUZZ=ON -DTSNAP_BUILD_TESTS=OFF -DTSNAP_BUILD_BENCH=OFF -DTSNAP_BUILD_EXAMPLES=OFF -DTSNAP_BUILD_CLI=OFF -DTSNAP_BUILD_TRAINING_STATE=OFF" \
  "$repo/scripts/build.sh" "${targets[@]}"

if [[ "${1:-}" == --seeds ]]; then
  # Only the corpora made from snapshots: corpus/s3_xml/ holds hand-written S3 answers.
  rm -rf "$repo/tests/fuzz/corpus"/{header,manifest,snapshot}
  mkdir -p "$repo/tests/fuzz/corpus"
  "$build_dir/tests/fuzz/tsnap_fuzz_seeds" "$repo/tests/fuzz/corpus"
  exit 0
fi

export TSNAP_FUZZ_SECONDS="${1:-60}"
log="$build_dir/fuzz.log"
status=0
ctest --test-dir "$build_dir" -L fuzz -V >"$log" 2>&1 || status=$?
sed -n 's/^[0-9]*: \(fuzz: \)/\1/p' "$log"
if ((status != 0)); then echo "fuzz: failed (log: $log)" >&2; fi
exit "$status"
