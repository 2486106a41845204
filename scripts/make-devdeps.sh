#!/usr/bin/env bash
# Packs the libraries a GPU test machine may lack (TBB, liburing, xxHash, GoogleTest: headers,
# libraries and CMake configs, from this Debian machine's packages) into .devdeps/usr, mirroring
# /usr so that the CMake configs find their files relative to themselves. Used with
# scripts/device-check.sh; .devdeps/ is not committed.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/.devdeps/usr"
lib=lib/x86_64-linux-gnu
rm -rf "$repo/.devdeps"
mkdir -p "$out/include" "$out/$lib/cmake"
cp -a /usr/include/tbb /usr/include/oneapi /usr/include/liburing /usr/include/liburing.h \
  /usr/include/xxhash.h /usr/include/gtest /usr/include/gmock "$out/include/"
cp -a /usr/$lib/libtbb.so* /usr/$lib/libtbbmalloc*.so* /usr/$lib/libtbbbind*.so* \
  /usr/$lib/liburing.so* /usr/$lib/libgtest*.a /usr/$lib/libgmock*.a "$out/$lib/"
cp -a /usr/$lib/cmake/TBB /usr/$lib/cmake/GTest "$out/$lib/cmake/"
du -sh "$repo/.devdeps"
