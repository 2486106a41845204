# The bench library, shared by the benchmark programs and the `tsnap bench` subcommand: options
# (CLI11), workloads, measurements and baselines, the save runner, the timeline, the restore
# measurement and the reports. Included from bench/CMakeLists.txt and from the CLI block of the
# top CMakeLists.txt (whichever comes first defines it), so that the tool builds with or without
# TSNAP_BUILD_BENCH. Its headers are included as "bench/<name>.h".
include_guard(GLOBAL)

find_package(CLI11 REQUIRED)
add_library(tsnap_bench STATIC
  ${CMAKE_CURRENT_LIST_DIR}/dist.cpp
  ${CMAKE_CURRENT_LIST_DIR}/measure.cpp  # the only translation unit with <torch/serialize.h>
  ${CMAKE_CURRENT_LIST_DIR}/options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/raw_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/report.cpp
  ${CMAKE_CURRENT_LIST_DIR}/restore.cpp
  ${CMAKE_CURRENT_LIST_DIR}/runner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/session.cpp
  ${CMAKE_CURRENT_LIST_DIR}/timeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/workloads.cpp)
target_include_directories(tsnap_bench PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(tsnap_bench PUBLIC tsnap_core CLI11::CLI11 PRIVATE Boost::headers)
# Designated initialisers that leave members at their defaults are the house style.
target_compile_options(tsnap_bench
  PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
