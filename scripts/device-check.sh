#!/usr/bin/env bash
# The GPU check, in one run on a GPU machine that has no network: builds tsnap against that
# machine's CUDA LibTorch (the torch package of its python3) and runs, each stage bounded in
# time and each reported even when an earlier one failed:
#   1. the C++ `cuda` suite (tests/cuda: save_async of device tensors, load_into device tensors)
#   2. the Python module tsnap._C (same build tree), and pytest: python/tests/test_cuda.py and
#      test_bench_cuda.py
#   3. the GPU benchmark, `python -m tsnap.bench --cuda` (tsnap/bench/_cuda.py): stall of
#      GPT-2 small + Adam on the GPU against a pinned cudaMemcpyAsync of the same bytes (target
#      <= 1.1x), durable, load_into GPU tensors against a raw read + H2D, a training loop's
#      step-time overhead with a snapshot every --block steps
#   4. the C++ pipeline suite (the CPU paths, on that machine's torch)
# then prints a summary (ok / FAILED per stage) and exits 1 if any stage failed.
#
# Before, on the Debian build machine: scripts/make-devdeps.sh (packs into .devdeps/ the
# headers and libraries that machine may lack: TBB, liburing, xxHash, GoogleTest, Boost's Asio,
# nlohmann-json, libcurl, OpenSSL; each is used only where the machine has none of its own).
# Then one call of the device tool, carrying .devdeps (git-ignored, about 33 MB):
#   run(command="bash scripts/device-check.sh", carry=[".devdeps"], timeout_s=600)
# Logs go to $OUT (the tool brings them back: device-check.log, build.log, bench-cuda.json),
# else to build-cuda/logs. The build takes the most time (the library, the tests and the
# module: a few minutes on 16 cores); expect about 7 minutes in all. The whole run ends by
# DEVICE_CHECK_SECONDS (default 560) after it starts, cutting the stages short if it must (the
# pipeline suite, last, first). A rerun on the same, still warm, machine rebuilds only what
# changed in build-cuda/.
# Environment: DEVICE_CHECK_SECONDS (the deadline), BENCH_ARGS (default: --repeat 2 --pairs 4
# --block 20 --loop-mb 500), DEVDEPS=all (use every .devdeps prefix even where the machine has its own: to
# check the pack on the build machine), DEVICE_CHECK_CONFIGURE_ONLY=1 (stop after CMake's
# configure step: the dependencies are found).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo" || exit 1
build="$repo/build-cuda"
logs="${OUT:-$build/logs}"
mkdir -p "$logs"
exec > >(tee "$logs/device-check.log") 2>&1
tee_pid=$!
deadline=$((SECONDS + ${DEVICE_CHECK_SECONDS:-560}))
export PYTHONUNBUFFERED=1
results=()
failed=0

# The summary ends every run, whatever stopped it; the log is complete once tee is done.
finish() {
  echo
  echo "== summary ($SECONDS s)"
  printf '%s\n' "${results[@]}"
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null
}
trap finish EXIT

# run_stage NAME LIMIT CMD...: runs CMD for at most LIMIT seconds (less if the deadline is
# nearer) and records the outcome.
run_stage() {
  local name=$1 limit=$2 t0=$SECONDS rc=0
  shift 2
  local left=$((deadline - SECONDS - 5))
  if ((left < 20)); then
    results+=("SKIPPED $name (out of time)")
    failed=1
    return
  fi
  ((limit > left)) && limit=$left
  echo
  echo "== $name (at most ${limit} s)"
  timeout -k 10 "$limit" "$@" || rc=$?
  if ((rc == 0)); then
    results+=("ok      $name ($((SECONDS - t0)) s)")
  else
    local why="exit $rc"
    ((rc == 124)) && why="timed out"
    results+=("FAILED  $name ($why, $((SECONDS - t0)) s)")
    failed=1
  fi
}

echo "== machine"
nvidia-smi -L 2>&1 | head -4
echo "cores $(nproc), $(free -g | awk '/Mem:/ {print $2}') GB memory; $(uname -r)"
(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")
g++ --version | head -1
cmake --version | head -1
df -hT /tmp "$repo" 2>/dev/null | awk 'NR > 1 {print "disk:", $7, $2, $5, "free"}'
py="$(command -v python3)"
if ! "$py" -c 'import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPU:",
      torch.cuda.is_available() and torch.cuda.get_device_name(0))'; then
  echo "device-check: $py cannot import torch"
  exit 1
fi
gpu=$("$py" -c 'import torch; print(int(torch.cuda.is_available()))')
((gpu)) || { results+=("FAILED  torch sees no GPU here: every CUDA test will skip"); failed=1; }
torch_dir="$("$py" -c 'import os, torch
print(os.path.join(os.path.dirname(torch.__file__), "share/cmake/Torch"))')"

# Dependencies: the machine's own where it has the headers, else the .devdeps prefix.
dev="$repo/.devdeps"
prefixes=()
have_header() {
  local d
  for d in /usr/include /usr/local/include /usr/include/x86_64-linux-gnu; do
    [[ -e "$d/$1" ]] && return 0
  done
  return 1
}
pick() {
  if [[ "${DEVDEPS:-}" != all ]] && have_header "$2"; then
    echo "deps: $1 from the machine"
  elif [[ -d "$dev/$1/usr" ]]; then
    echo "deps: $1 from .devdeps"
    prefixes+=("$dev/$1/usr")
  else
    echo "deps: $1 is missing here and not in .devdeps (scripts/make-devdeps.sh, carry .devdeps)"
  fi
}
pick tbb oneapi/tbb.h
pick uring liburing.h
pick xxhash xxhash.h
pick gtest gtest/gtest.h
pick boost boost/version.hpp
pick json nlohmann/json.hpp
pick curl curl/curl.h
pick openssl openssl/evp.h
# Run-time libraries: the sonames this machine lacks, from .devdeps/runtime, in one directory
# that the link (-rpath-link) and the programs (LD_LIBRARY_PATH) search.
rt=/tmp/tsnap-devlibs
rm -rf "$rt"
mkdir -p "$rt"
ld_cache="$(ldconfig -p 2>/dev/null)"
have_lib() {
  local d
  grep -q "^[[:space:]]*$1 (" <<<"$ld_cache" && return 0
  for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/local/lib /lib64 /usr/lib64; do
    [[ -e "$d/$1" ]] && return 0
  done
  return 1
}
for f in "$dev"/runtime/*; do
  [[ -e "$f" ]] || continue
  so=$(basename "$f")
  if [[ "${DEVDEPS:-}" == all ]] || ! have_lib "$so"; then ln -s "$f" "$rt/$so"; fi
done
echo "deps: run-time libraries from .devdeps: $(ls "$rt" | tr '\n' ' ')"
export LD_LIBRARY_PATH="$rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The Python module needs Python's headers (Development.Module).
python_module=ON
if ! "$py" -c 'import os, sysconfig, sys
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  python_module=OFF
  results+=("FAILED  no Python.h for $py: the Python module and its tests are not built")
  failed=1
fi
generator=(-G Ninja)
command -v ninja >/dev/null 2>&1 || generator=()
keep_going=(-k 0)
((${#generator[@]})) || keep_going=(-k)

echo
echo "== configure (build-cuda)"
prefix_path=$(IFS=';'; echo "${prefixes[*]:-}")
if ! cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_STANDARD="${CXX_STD:-17}" -DTorch_DIR="$torch_dir" \
    -DCMAKE_PREFIX_PATH="$prefix_path" -DTSNAP_BUILD_BENCH=OFF -DTSNAP_BUILD_EXAMPLES=OFF \
    -DTSNAP_BUILD_CLI=OFF -DTSNAP_BUILD_PYTHON="$python_module" -DPython_EXECUTABLE="$py" \
    -DTSNAP_PYTHON="$py" -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$rt" \
    -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$rt" \
    -DCMAKE_MODULE_LINKER_FLAGS="-Wl,-rpath-link,$rt" >"$logs/configure.log" 2>&1; then
  grep -E -A5 "CMake Error|Could NOT find" "$logs/configure.log" | head -40
  results+=("FAILED  configure (see configure.log)")
  exit 1
fi
grep -E "^-- tsnap:" "$logs/configure.log"
if [[ -n "${DEVICE_CHECK_CONFIGURE_ONLY:-}" ]]; then
  results+=("ok      configure")
  exit 0
fi

echo
echo "== build (log: build.log)"
targets=(tsnap_cuda_tests tsnap_pipeline_tests)
[[ "$python_module" == ON ]] && targets+=(tsnap_python)
t0=$SECONDS
# The build leaves the tests at least two minutes.
build_limit=$((deadline - SECONDS - 120))
((build_limit < 60)) && build_limit=60
if timeout -k 10 "$build_limit" cmake --build "$build" -j "$(nproc)" \
    --target "${targets[@]}" -- "${keep_going[@]}" >"$logs/build.log" 2>&1; then
  results+=("ok      build (${targets[*]}, $((SECONDS - t0)) s)")
else
  grep -E -B2 -A12 "error:|FAILED:|undefined reference|cannot find" "$logs/build.log" | head -80
  results+=("FAILED  build (see build.log; what did build still runs, $((SECONDS - t0)) s)")
  failed=1
fi
# (The module finds LibTorch's libraries once `import torch` has loaded them.)
for exe in "$build"/tests/tsnap_cuda_tests "$build"/tests/tsnap_pipeline_tests; do
  [[ -e "$exe" ]] && ldd "$exe" | grep "not found" && echo "(libraries $exe lacks)"
done

# 1. The C++ cuda suite; on a GPU machine none of its tests may skip.
if [[ -x "$build/tests/tsnap_cuda_tests" ]]; then
  run_stage "C++ cuda tests" 240 bash -c \
    "set -o pipefail; '$build/tests/tsnap_cuda_tests' 2>&1 | tee '$build/cuda-tests.out'"
  if ((gpu)) && grep -q "SKIPPED \]" "$build/cuda-tests.out" 2>/dev/null; then
    results+=("FAILED  C++ cuda tests skipped on a GPU machine")
    failed=1
  fi
fi

# 2. The Python package from the build tree (python/tsnap plus the module), and pytest.
pkg=/tmp/tsnap-py
if compgen -G "$build/python/_C*.so" >/dev/null; then
  rm -rf "$pkg"
  mkdir -p "$pkg/tsnap"
  cp -R python/tsnap/. "$pkg/tsnap/"  # with its subpackage (tsnap/bench/)
  cp "$build"/python/_C*.so "$build/python/_build_info.py" "$pkg/tsnap/"
  export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
  run_stage "pytest (cuda, bench --cuda)" 200 bash -c "set -o pipefail; '$py' -m pytest \
    -q -rs -p no:cacheprovider python/tests/test_cuda.py python/tests/test_bench_cuda.py \
    2>&1 | tee '$build/pytest.out'"
  if ((gpu)) && grep -q "SKIPPED.*test_cuda.py" "$build/pytest.out" 2>/dev/null; then
    results+=("FAILED  pytest: CUDA tests skipped on a GPU machine")
    failed=1
  fi

  # 3. The GPU benchmark.
  read -ra bench_args <<<"${BENCH_ARGS:---repeat 2 --pairs 4 --block 20 --loop-mb 500}"
  run_stage "python -m tsnap.bench --cuda ${bench_args[*]}" 240 "$py" -m tsnap.bench --cuda \
    "${bench_args[@]}" --dir "$build" --json "$logs/bench-cuda.json"
fi

# 4. The C++ pipeline suite.
if [[ -x "$build/tests/tsnap_pipeline_tests" ]]; then
  run_stage "C++ pipeline tests" 180 "$build/tests/tsnap_pipeline_tests" --gtest_brief=1
fi
exit $failed
