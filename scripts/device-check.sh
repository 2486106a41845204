#!/usr/bin/env bash
# Runs on a GPU machine: builds tsnap against that machine's CUDA LibTorch (the torch package of
# its Python) and runs the CUDA staging tests (ctest label `cuda`). Libraries the machine lacks
# come from .devdeps/ (scripts/make-devdeps.sh on the Debian build machine).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
torch_dir="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "share/cmake/Torch"))')"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
deps="$repo/.devdeps/usr"
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD="${CXX_STD:-17}" \
  -DTorch_DIR="$torch_dir" -DCMAKE_PREFIX_PATH="$deps" \
  -DTSNAP_BUILD_BENCH=OFF -DTSNAP_BUILD_EXAMPLES=OFF -DTSNAP_BUILD_CLI=OFF \
  -DCMAKE_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu" -DCMAKE_INCLUDE_PATH="$deps/include" 2>&1 | tail -5
if ! cmake --build build-cuda -j "$(nproc)" --target tsnap_cuda_tests tsnap_pipeline_tests \
    > build-cuda/build.log 2>&1; then
  grep -E "error|FAILED" build-cuda/build.log | head -40
  exit 1
fi
export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
./build-cuda/tests/tsnap_cuda_tests
./build-cuda/tests/tsnap_pipeline_tests --gtest_brief=1
