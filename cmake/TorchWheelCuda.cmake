# A CUDA LibTorch from the torch wheel carries its CUDA runtime in the wheel's nvidia/ packages,
# while its CMake config links the CUDA runtime (and NVRTC) of whatever CUDA toolkit it finds on
# the machine (nvcc is needed only for that search). Linking the toolkit's copies puts the
# toolkit's library directory on the binaries' RPATH, so the linker and the loader would also
# take the toolkit's older NCCL and runtime for libtorch_cuda.so. tsnap_use_wheel_cuda_runtime()
# makes CUDA targets link the wheel's own runtime instead (and leaves NVRTC, which tsnap does
# not use, to libtorch_cuda.so). Call it after find_package(Torch); it does nothing for other
# LibTorch builds. Used by tsnap's own build and by its installed package config.
function(tsnap_use_wheel_cuda_runtime torch_prefix)
  if(NOT TARGET torch::cudart)
    return()
  endif()
  get_filename_component(site "${torch_prefix}/.." ABSOLUTE)
  file(GLOB cudart "${site}/nvidia/*/lib/libcudart.so.[0-9]*")
  if(NOT cudart)
    return()  # not a wheel: keep the toolkit's runtime (or none, tsnap_define_cudart's)
  endif()
  list(GET cudart 0 cudart)
  get_filename_component(cudart_dir "${cudart}" DIRECTORY)
  set(TSNAP_CUDA_RUNTIME_DIR "${cudart_dir}" PARENT_SCOPE)
  set_property(TARGET torch::cudart PROPERTY INTERFACE_LINK_LIBRARIES "${cudart}")
  # GNU ld does not expand libtorch_cuda.so's $ORIGIN RUNPATH when it looks for that library's
  # own dependencies (NCCL, cuBLAS, ...): name the wheel's directories to it.
  file(GLOB dirs LIST_DIRECTORIES true "${site}/nvidia/*/lib")
  string(REPLACE ";" ":" dirs "${dirs}")
  set_property(TARGET torch::cudart PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${dirs}")
  set(libraries ${TORCH_LIBRARIES})
  list(FILTER libraries EXCLUDE REGEX "/libnvrtc[^/]*$|/libcudart[^/]*$")
  set(TORCH_LIBRARIES ${libraries} PARENT_SCOPE)
endfunction()

# A CUDA LibTorch's config looks for the CUDA toolkit (nvcc and its libraries) even on machines
# without a GPU; its usual home is searched when nvcc is not on PATH. Call before
# find_package(Torch).
macro(tsnap_hint_cuda_toolkit)
  if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda/bin/nvcc)
    find_program(TSNAP_NVCC nvcc)
    if(NOT TSNAP_NVCC)
      set(CUDAToolkit_ROOT /usr/local/cuda)
    endif()
  endif()
endmacro()

# The installed package's config: the directory of the consumer's TorchConfig.cmake, found
# without running it: Torch_DIR, else the first CMAKE_PREFIX_PATH entry (variable, then
# environment) that holds share/cmake/Torch, else `fallback` if it is there, else "" (LibTorch
# may still be found in the system's directories).
function(tsnap_locate_torch out fallback)
  string(REPLACE ":" ";" env_prefix_path "$ENV{CMAKE_PREFIX_PATH}")
  set(candidates "${Torch_DIR}")
  foreach(prefix IN LISTS CMAKE_PREFIX_PATH env_prefix_path)
    list(APPEND candidates "${prefix}/share/cmake/Torch")
  endforeach()
  foreach(dir IN LISTS candidates ITEMS "${fallback}")
    if(dir AND EXISTS "${dir}/TorchConfig.cmake")
      set(${out} "${dir}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

# The installed package's config, before find_dependency(Torch) with the LibTorch of `torch_dir`,
# unless the consumer has loaded LibTorch already: defines torch::cudart, the CUDA target that
# LibTorch's own targets (c10_cuda, torch_cuda) link. LibTorch's CUDA setup (Caffe2's
# public/cuda.cmake) returns at once when that target exists, so a CUDA LibTorch's config then
# needs no CUDA toolkit: it does not look for nvcc (without which it stops with "Your installed
# Caffe2 version uses CUDA but I cannot find the CUDA libraries"), does not enable the CUDA
# language, and does not put the toolkit's NVRTC in TORCH_LIBRARIES next to the wheel's runtime
# (two directories with the same libraries, for which CMake "cannot generate a safe runtime
# search path"). tsnap_use_wheel_cuda_runtime() then gives the target the wheel's runtime; for
# another CUDA LibTorch it stays empty, as libtorch_cuda.so brings its runtime from LibTorch's
# lib/, which the linker and the loader search already. A consumer that compiles CUDA code with
# LibTorch's CUDA settings (CMAKE_CUDA_FLAGS, CUDA::*) calls find_package(Torch) first. Does
# nothing when that LibTorch's public/cuda.cmake has no such early return.
function(tsnap_define_cudart torch_dir)
  if(TARGET torch::cudart OR NOT EXISTS "${torch_dir}/../Caffe2/public/cuda.cmake")
    return()
  endif()
  file(READ "${torch_dir}/../Caffe2/public/cuda.cmake" cuda_cmake)
  if(NOT cuda_cmake MATCHES "if\\(TARGET torch::cudart\\)[ \t\r\n]+return\\(\\)")
    return()
  endif()
  add_library(torch::cudart INTERFACE IMPORTED)
endfunction()

# After find_dependency(Torch): the targets of public/cuda.cmake that LibTorch's CUDA targets link
# (torch::nvtoolsext in older releases) and that nobody defined, as tsnap_define_cudart() skipped
# that file, defined empty: their libraries come with libtorch_cuda.so, as its runtime does.
function(tsnap_define_skipped_cuda_targets)
  foreach(target c10_cuda torch_cuda)
    if(TARGET ${target})
      get_target_property(deps ${target} INTERFACE_LINK_LIBRARIES)
      foreach(dep IN LISTS deps)
        if(dep MATCHES "^(torch|caffe2)::" AND NOT TARGET ${dep})
          add_library(${dep} INTERFACE IMPORTED)
        endif()
      endforeach()
    endif()
  endforeach()
endfunction()
