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
    return()  # not a wheel: keep the toolkit's runtime
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
