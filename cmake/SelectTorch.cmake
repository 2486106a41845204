# Which LibTorch tsnap builds against, chosen with -DTSNAP_TORCH=...:
#   wheel   LibTorch 2.x from the `torch` wheel on PyPI, installed by scripts/install-deps.sh into
#           the project's virtual environment (.venv/); or the torch of TSNAP_PYTHON.
#   debian  Debian's libtorch-dev (1.13, /usr).
#   auto    (default) the wheel when .venv/ holds one, else whatever find_package(Torch) finds.
# With `auto`, an explicit -DTorch_DIR=... wins. Sets TSNAP_TORCH_KIND (wheel, debian, other) and,
# after find_package(Torch), TSNAP_TORCH_VERSION.

set(TSNAP_TORCH "auto" CACHE STRING "LibTorch to build against: auto, wheel or debian")
set_property(CACHE TSNAP_TORCH PROPERTY STRINGS auto wheel debian)
set(TSNAP_PYTHON "" CACHE FILEPATH "Python whose torch package provides LibTorch (wheel)")

# The CMake config directory of the torch package of the project's virtual environment (or of
# TSNAP_PYTHON), or "" when there is none.
function(tsnap_wheel_torch_dir out)
  set(dir "")
  if(TSNAP_PYTHON)
    execute_process(
      COMMAND ${TSNAP_PYTHON} -c
              "import os, importlib.util as u; print(os.path.dirname(u.find_spec('torch').origin))"
      OUTPUT_VARIABLE torch_root OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0 AND EXISTS "${torch_root}/share/cmake/Torch/TorchConfig.cmake")
      set(dir "${torch_root}/share/cmake/Torch")
    endif()
  else()
    # No interpreter needed: the venv's layout is fixed (importing torch takes seconds).
    file(GLOB configs "${PROJECT_SOURCE_DIR}/.venv/lib/python3*/site-packages/torch/share/cmake/Torch/TorchConfig.cmake")
    if(configs)
      list(GET configs 0 config)
      get_filename_component(dir "${config}" DIRECTORY)
    endif()
  endif()
  set(${out} "${dir}" PARENT_SCOPE)
endfunction()

if(TSNAP_TORCH STREQUAL "debian")
  set(TSNAP_TORCH_KIND debian)
  find_path(TSNAP_DEBIAN_TORCH_DIR TorchConfig.cmake
            PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch /usr/lib/cmake/Torch
            NO_DEFAULT_PATH)
  if(NOT TSNAP_DEBIAN_TORCH_DIR)
    message(FATAL_ERROR "TSNAP_TORCH=debian: Debian's libtorch-dev is not installed "
                        "(TSNAP_TORCH=debian scripts/install-deps.sh installs it)")
  endif()
  set(Torch_DIR "${TSNAP_DEBIAN_TORCH_DIR}" CACHE PATH "LibTorch's CMake config" FORCE)
elseif(TSNAP_TORCH STREQUAL "auto" AND Torch_DIR AND NOT Torch_DIR MATCHES "/site-packages/torch/")
  set(TSNAP_TORCH_KIND other)  # named by the user
elseif(TSNAP_TORCH STREQUAL "wheel" OR TSNAP_TORCH STREQUAL "auto")
  tsnap_wheel_torch_dir(wheel_dir)
  if(wheel_dir)
    set(TSNAP_TORCH_KIND wheel)
    set(Torch_DIR "${wheel_dir}" CACHE PATH "LibTorch's CMake config" FORCE)
  elseif(TSNAP_TORCH STREQUAL "wheel")
    message(FATAL_ERROR "TSNAP_TORCH=wheel: no torch wheel in ${PROJECT_SOURCE_DIR}/.venv "
                        "(scripts/install-deps.sh installs it) nor for TSNAP_PYTHON")
  else()
    set(TSNAP_TORCH_KIND other)
  endif()
else()
  message(FATAL_ERROR "TSNAP_TORCH must be auto, wheel or debian, not '${TSNAP_TORCH}'")
endif()

include(${CMAKE_CURRENT_LIST_DIR}/TorchWheelCuda.cmake)
tsnap_hint_cuda_toolkit()

# The config's own lookups (Caffe2Config, libtorch.so) search CMAKE_PREFIX_PATH before the
# system: with the wheel's prefix there, a Debian LibTorch also installed cannot mix in.
get_filename_component(TSNAP_TORCH_PREFIX "${Torch_DIR}/../../.." ABSOLUTE)
list(PREPEND CMAKE_PREFIX_PATH "${TSNAP_TORCH_PREFIX}")
find_package(Torch REQUIRED)
tsnap_use_wheel_cuda_runtime("${TSNAP_TORCH_PREFIX}")
set(TSNAP_TORCH_VERSION "${Torch_VERSION}")
# Where installed binaries find LibTorch when it is not in a system directory (the wheel's).
set(TSNAP_TORCH_RPATH "")
if(NOT TSNAP_TORCH_KIND STREQUAL "debian")
  set(TSNAP_TORCH_RPATH "${TSNAP_TORCH_PREFIX}/lib" ${TSNAP_CUDA_RUNTIME_DIR})
endif()
message(STATUS "tsnap: LibTorch ${Torch_VERSION} (${TSNAP_TORCH_KIND}) from ${Torch_DIR}")
