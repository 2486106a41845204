#!/usr/bin/env bash
# Builds tsnap with sanitizers (clang 14, LibTorch from the torch wheel) and runs test suites
# under them:
#   scripts/sanitize.sh asan [ctest args]  ASan + UBSan in build-asan/; by default every unit
#                                          suite (label unit, less the packaging check)
#   scripts/sanitize.sh tsan [ctest args]  TSan in build-tsan/; by default the pipeline, restore
#                                          and policy suites (the ones with threads of their own)
# Extra arguments replace the default ctest selection. Only the test programs of the default
# selection are built (TARGETS="tsnap_io_tests ..." builds others). CXX picks another compiler
# for a new build directory (g++ works too).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-}"
shift || true
case "$mode" in
  asan)
    sanitize=address
    targets=(tsnap_common_tests tsnap_format_tests tsnap_io_tests tsnap_plan_tests
             tsnap_stage_tests tsnap_pipeline_tests tsnap_restore_tests tsnap_state_tests
             tsnap_policy_tests)
    # The packaging consumer is built without sanitizers; the tool (and so its tests, `cli`)
    # is not built here.
    tests=(-L unit -E '^(packaging[.]|cli$)')
    ;;
  tsan)
    sanitize=thread
    targets=(tsnap_pipeline_tests tsnap_restore_tests tsnap_policy_tests)
    tests=(-R '^(pipeline|restore|policy)$')
    ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan [ctest args]" >&2
    exit 2
    ;;
esac
if (($# > 0)); then tests=("$@"); fi
if [[ -n "${TARGETS:-}" ]]; then read -ra targets <<<"$TARGETS"; fi
build_dir="$repo/build-$mode"

CXX="${CXX:-clang++-14}" TSNAP_BUILD_DIR="$build_dir" \
  TSNAP_CMAKE_ARGS="-DTSNAP_SANITIZE=$sanitize -DTSNAP_BUILD_BENCH=OFF -DTSNAP_BUILD_EXAMPLES=OFF -DTSNAP_BUILD_CLI=OFF" \
  "$repo/scripts/build.sh" "${targets[@]}"

# LibTorch, TBB and the C++ runtime are not instrumented. ASan needs nothing for that: its
# defaults hold (leak checks included: LibTorch's process-wide caches stay reachable), plus
# stack-use-after-return checks. UB is fatal (-fno-sanitize-recover); print where it happened.
# TSan: ignore_noninstrumented_modules=0 (its default on Linux, set to be sure) so that the
# condition-variable and mutex calls that libstdc++ makes on tsnap's behalf are seen, or a notify
# on a destroyed condition variable goes unreported; what TBB and LibTorch do inside themselves
# is suppressed narrowly in tests/tsan.supp.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
# LibTorch's own intra-op parallelism (OpenMP, in its convolution kernels) hands work to libgomp
# threads TSan cannot see synchronize: it reported a memset of a dnnl worker racing with the
# allocation on the main thread. tsnap starts no OpenMP work, so under TSan LibTorch runs its
# kernels on the calling thread.
if [[ "$sanitize" == thread ]]; then export OMP_NUM_THREADS=1; fi
export TSAN_OPTIONS="${TSAN_OPTIONS:-suppressions=$repo/tests/tsan.supp:ignore_noninstrumented_modules=0:halt_on_error=1:second_deadlock_stack=1}"
ctest --test-dir "$build_dir" "${tests[@]}" --output-on-failure -j2
