# Sanitizer builds and the libFuzzer targets (scripts/sanitize.sh, scripts/fuzz.sh):
#   TSNAP_SANITIZE=address  ASan + UBSan (UB is fatal: -fno-sanitize-recover)
#   TSNAP_SANITIZE=thread   TSan
#   TSNAP_FUZZ=ON           the fuzz targets of tests/fuzz (clang only; implies address)
# Every object of the build gets the flags; LibTorch, TBB and the C++ runtime stay
# uninstrumented (scripts/sanitize.sh sets the runtime options that this needs).
#
# With clang, the address build also carries libFuzzer's coverage instrumentation
# (-fsanitize=fuzzer-no-link, which the ASan runtime satisfies in programs without libFuzzer):
# the ASan unit suites (build-asan/) and the fuzz targets (build-fuzz/) then compile identical
# library objects, and the second build of CI is all ccache hits.

set(TSNAP_SANITIZE "" CACHE STRING "Sanitizers: address (ASan+UBSan), thread (TSan) or none")
set_property(CACHE TSNAP_SANITIZE PROPERTY STRINGS "" address thread)
option(TSNAP_FUZZ "Build the libFuzzer targets under tests/fuzz (clang; implies address)" OFF)

set(TSNAP_IS_CLANG OFF)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  set(TSNAP_IS_CLANG ON)
endif()
if(TSNAP_FUZZ)
  if(NOT TSNAP_IS_CLANG)
    message(FATAL_ERROR "TSNAP_FUZZ needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: "
                        "configure with CXX=clang++-14 (scripts/fuzz.sh does)")
  endif()
  if(TSNAP_SANITIZE STREQUAL "")
    set(TSNAP_SANITIZE address CACHE STRING "" FORCE)
  elseif(NOT TSNAP_SANITIZE STREQUAL "address")
    message(FATAL_ERROR "TSNAP_FUZZ builds with TSNAP_SANITIZE=address, not ${TSNAP_SANITIZE}")
  endif()
endif()

if(TSNAP_SANITIZE STREQUAL "address")
  set(TSNAP_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined)
  set(TSNAP_COVERAGE_FLAGS "")
  if(TSNAP_IS_CLANG)
    set(TSNAP_COVERAGE_FLAGS -fsanitize=fuzzer-no-link)
  endif()
  add_compile_options(${TSNAP_SANITIZER_FLAGS} ${TSNAP_COVERAGE_FLAGS} -fno-omit-frame-pointer)
  add_link_options(${TSNAP_SANITIZER_FLAGS})
elseif(TSNAP_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT TSNAP_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TSNAP_SANITIZE must be address, thread or empty, not '${TSNAP_SANITIZE}'")
endif()
if(NOT TSNAP_SANITIZE STREQUAL "")
  message(STATUS "tsnap: sanitizers: ${TSNAP_SANITIZE}")
endif()
