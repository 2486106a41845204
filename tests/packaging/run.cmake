# The installed package works from another project, wherever the prefix is:
#   cmake -DSOURCE_DIR=<tsnap source> -DBINARY_DIR=<tsnap build> -DCXX=<compiler> -P run.cmake
# installs the already built project into a prefix under BINARY_DIR and checks that the exported
# targets name no file by an absolute path (LibTorch comes as its imported target, from the
# consumer's find_package(Torch)). It then moves the prefix to another directory, removing the
# original, and configures consumer/ against the moved prefix only, as a LibTorch user would:
# find_package(tsnap) then find_package(Torch), LibTorch named by CMAKE_PREFIX_PATH, no C++
# standard set. The installed library and the torch-free tool have no RUNPATH and no debug
# information (outside Debug builds). That configure must not look for a CUDA toolkit (find_package(CUDA) and
# find_package(CUDAToolkit) are disabled, as on a machine without nvcc, where a CUDA LibTorch's
# own config stops) and must print no warning about unsafe runtime or linker search paths. The
# consumer is built, saves and loads a snapshot, and the moved `tsnap --version` runs when the
# tool was built. Any failure is fatal.

foreach(var SOURCE_DIR BINARY_DIR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "packaging: pass -D${var}=...")
  endif()
endforeach()

set(work ${BINARY_DIR}/packaging)
set(prefix ${work}/prefix)
set(moved ${work}/prefix-moved)
set(consumer_build ${work}/consumer-build)
file(REMOVE_RECURSE ${work})
file(MAKE_DIRECTORY ${work})

# Runs a command; stops with its output when it fails.
function(run_step name)
  message(STATUS "packaging: ${name}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output
                  ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "packaging: ${name} failed (${result}):\n${output}")
  endif()
  set(step_output "${output}" PARENT_SCOPE)
endfunction()

run_step("install into ${prefix}" ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix})

# tsnapConfig.cmake may name the build's LibTorch, as a last place to look; the targets may not.
file(GLOB exports ${prefix}/lib*/cmake/tsnap/tsnapTargets*.cmake)
if(NOT exports)
  message(FATAL_ERROR "packaging: no tsnapTargets*.cmake under ${prefix}")
endif()
foreach(export ${exports})
  file(STRINGS ${export} absolute REGEX "[\";]/[^\";]")
  if(absolute)
    message(FATAL_ERROR "packaging: ${export} names absolute paths:\n${absolute}")
  endif()
endforeach()

# The installed library and the torch-free tool name no build-machine path in their RUNPATH
# (readelf -d), and a build that is not Debug installs them stripped (no .debug_info).
load_cache(${BINARY_DIR} READ_WITH_PREFIX cache_ CMAKE_BUILD_TYPE)
file(GLOB installed_lib ${prefix}/lib*/libtsnap.so.*.*.*)
set(checked ${installed_lib})
if(EXISTS ${prefix}/bin/tsnap)
  list(APPEND checked ${prefix}/bin/tsnap)
endif()
foreach(file ${checked})
  execute_process(COMMAND readelf -d ${file} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "packaging: readelf -d ${file} failed")
  endif()
  if(dynamic MATCHES "R(UN)?PATH[^\n]*\\[([^]]*)\\]")
    message(FATAL_ERROR "packaging: ${file} has a RUNPATH: ${CMAKE_MATCH_2}")
  endif()
  if(NOT cache_CMAKE_BUILD_TYPE STREQUAL "Debug")
    execute_process(COMMAND readelf -S ${file} OUTPUT_VARIABLE sections)
    if(sections MATCHES "\\.debug_info")
      message(FATAL_ERROR "packaging: ${file} was installed with its debug information")
    endif()
  endif()
endforeach()

file(RENAME ${prefix} ${moved})
if(EXISTS ${prefix})
  message(FATAL_ERROR "packaging: ${prefix} is still there after the move")
endif()

# Build the consumer the way the project itself was built (generator, compiler cache), against
# the LibTorch the project was built with.
load_cache(${BINARY_DIR} READ_WITH_PREFIX parent_
           CMAKE_GENERATOR CMAKE_MAKE_PROGRAM CMAKE_CXX_COMPILER_LAUNCHER Torch_DIR)
get_filename_component(torch_prefix "${parent_Torch_DIR}/../../.." ABSOLUTE)
set(configure_args -S ${SOURCE_DIR}/tests/packaging/consumer -B ${consumer_build}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} "-DCMAKE_PREFIX_PATH=${moved};${torch_prefix}"
    -DCMAKE_DISABLE_FIND_PACKAGE_CUDA=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
    --no-warn-unused-cli)
if(parent_CMAKE_GENERATOR)
  list(APPEND configure_args -G ${parent_CMAKE_GENERATOR})
endif()
if(parent_CMAKE_MAKE_PROGRAM)
  list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${parent_CMAKE_MAKE_PROGRAM})
endif()
if(parent_CMAKE_CXX_COMPILER_LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${parent_CMAKE_CXX_COMPILER_LAUNCHER})
endif()
run_step("configure the consumer against ${moved}" ${CMAKE_COMMAND} ${configure_args})
if(step_output MATCHES "safe (runtime|linker) search path")
  message(FATAL_ERROR "packaging: the consumer's configure warned about search paths:\n"
                      "${step_output}")
endif()
run_step("build the consumer" ${CMAKE_COMMAND} --build ${consumer_build})
run_step("run the consumer" ${consumer_build}/consumer ${work}/snapshots)
if(NOT step_output MATCHES "(^|\n)ok\n")
  message(FATAL_ERROR "packaging: the consumer did not print ok:\n${step_output}")
endif()

if(EXISTS ${moved}/bin/tsnap)
  run_step("run the installed tsnap --version" ${moved}/bin/tsnap --version)
  string(STRIP "${step_output}" version)
  message(STATUS "packaging: ${version}")
endif()
message(STATUS "packaging: ok")
