# The installed package works from another project:
#   cmake -DSOURCE_DIR=<tsnap source> -DBINARY_DIR=<tsnap build> -DCXX=<compiler> -P run.cmake
# installs the already built project into a prefix under BINARY_DIR, configures and builds
# consumer/ (find_package(tsnap CONFIG REQUIRED), tsnap::tsnap) against that prefix only, runs
# it, and runs the installed `tsnap --version` when the tool was built. Any failure is fatal.

foreach(var SOURCE_DIR BINARY_DIR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "packaging: pass -D${var}=...")
  endif()
endforeach()

set(work ${BINARY_DIR}/packaging)
set(prefix ${work}/prefix)
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

# Build the consumer the way the project itself was built (generator, compiler cache).
load_cache(${BINARY_DIR} READ_WITH_PREFIX parent_
           CMAKE_GENERATOR CMAKE_MAKE_PROGRAM CMAKE_CXX_COMPILER_LAUNCHER)
set(configure_args -S ${SOURCE_DIR}/tests/packaging/consumer -B ${consumer_build}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix})
if(parent_CMAKE_GENERATOR)
  list(APPEND configure_args -G ${parent_CMAKE_GENERATOR})
endif()
if(parent_CMAKE_MAKE_PROGRAM)
  list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${parent_CMAKE_MAKE_PROGRAM})
endif()
if(parent_CMAKE_CXX_COMPILER_LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${parent_CMAKE_CXX_COMPILER_LAUNCHER})
endif()
run_step("configure the consumer" ${CMAKE_COMMAND} ${configure_args})
run_step("build the consumer" ${CMAKE_COMMAND} --build ${consumer_build})
run_step("run the consumer" ${consumer_build}/consumer ${work}/snapshots)
if(NOT step_output MATCHES "(^|\n)ok\n")
  message(FATAL_ERROR "packaging: the consumer did not print ok:\n${step_output}")
endif()

if(EXISTS ${prefix}/bin/tsnap)
  run_step("run the installed tsnap --version" ${prefix}/bin/tsnap --version)
  string(STRIP "${step_output}" version)
  message(STATUS "packaging: ${version}")
endif()
message(STATUS "packaging: ok")
