#!/usr/bin/env bash
# Packs the libraries a GPU test machine may lack, from this Debian machine's packages, into
# .devdeps/ for scripts/device-check.sh (which uses each one only where that machine has none of
# its own). .devdeps/ is git-ignored: name it in the device tool's `carry`.
#   .devdeps/<name>/usr/   one prefix per dependency, mirroring /usr (headers, libraries, CMake
#                          configs, which find their files relative to themselves): tbb, uring,
#                          xxhash, gtest, boost (the headers tsnap includes, with what they
#                          include, and all of Asio and Boost.Config), json, curl, openssl
#   .devdeps/runtime/      every shared library those need at run time, under its soname, with
#                          the libraries they need in turn (libcurl's closure), C and C++
#                          runtimes excepted
# About 30 MB.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/.devdeps"
arch=x86_64-linux-gnu
lib="lib/$arch"
rm -rf "$out"

# The run-time libraries by soname, with their own needs (glibc and the C++ runtime are on
# every machine; device-check.sh uses only the sonames its machine lacks).
mkdir -p "$out/runtime"
system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+)\.'
for l in libtbb.so.12 libtbbmalloc.so.2 liburing.so.2 libcurl.so.4 libssl.so.3 libcrypto.so.3; do
  echo "$l => /usr/$lib/$l"
  ldd "/usr/$lib/$l" | awk '$2 == "=>" && $3 ~ /^\// {print $1, "=>", $3}'
done | sort -u | while read -r soname _ path; do
  if [[ ! "$soname" =~ $system ]]; then cp -L "$path" "$out/runtime/$soname"; fi
done

# prefix NAME: makes .devdeps/NAME/usr with include/ and lib/<arch>/cmake/ and prints its path.
prefix() {
  local p="$out/$1/usr"
  mkdir -p "$p/include" "$p/$lib/cmake"
  echo "$p"
}

p=$(prefix tbb)
cp -a /usr/include/tbb /usr/include/oneapi "$p/include/"
cp -a /usr/$lib/libtbb.so* /usr/$lib/libtbbmalloc*.so* /usr/$lib/libtbbbind*.so* "$p/$lib/"
cp -a /usr/$lib/cmake/TBB "$p/$lib/cmake/"

p=$(prefix uring)
cp -a /usr/include/liburing /usr/include/liburing.h "$p/include/"
cp -a /usr/$lib/liburing.so* "$p/$lib/"

p=$(prefix xxhash)
cp -a /usr/include/xxhash.h "$p/include/"

p=$(prefix gtest)
cp -a /usr/include/gtest /usr/include/gmock "$p/include/"
cp -a /usr/$lib/libgtest*.a /usr/$lib/libgmock*.a "$p/$lib/"
cp -a /usr/$lib/cmake/GTest "$p/$lib/cmake/"

# Boost: the headers that tsnap's sources include, and every header they include (as C++17 and
# C++20), plus all of Asio and Boost.Config, whose branches another compiler may take.
p=$(prefix boost)
includes=$(grep -rhoE "#include <boost/[^>]+>" "$repo/src" "$repo/include" "$repo/python/src" \
  "$repo/tests" | sort -u)
{
  for std in c++17 c++20; do
    echo "$includes" | g++ -std=$std -D_GNU_SOURCE -M -x c++ - -o - | tr ' \\' '\n\n'
  done
  find /usr/include/boost/asio /usr/include/boost/config -type f
  echo /usr/include/boost/version.hpp
} | grep "^/usr/include/boost/" | sort -u | while read -r f; do
  mkdir -p "$p/include/$(dirname "${f#/usr/include/}")"
  cp -a "$f" "$p/include/${f#/usr/include/}"
done
cp -a /usr/include/boost/asio.hpp "$p/include/boost/"
cp -a /usr/$lib/cmake/Boost-* /usr/$lib/cmake/boost_headers-* /usr/$lib/cmake/BoostDetectToolset-* \
  "$p/$lib/cmake/"

p=$(prefix json)
cp -a /usr/include/nlohmann "$p/include/"
mkdir -p "$p/share/cmake"
cp -a /usr/share/cmake/nlohmann_json "$p/share/cmake/"

# libcurl and OpenSSL: headers (the architecture's own ones merged in) and the link names, to
# the libraries in runtime/.
p=$(prefix curl)
cp -a /usr/include/$arch/curl "$p/include/"
ln -s ../../../../runtime/libcurl.so.4 "$p/$lib/libcurl.so"

p=$(prefix openssl)
cp -a /usr/include/openssl "$p/include/"
cp -a /usr/include/$arch/openssl/. "$p/include/openssl/"
for l in libcrypto libssl; do ln -s ../../../../runtime/$l.so.3 "$p/$lib/$l.so"; done

du -sh "$out"
