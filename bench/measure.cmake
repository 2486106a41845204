# The libraries shared by the benchmark programs and the `tsnap bench` subcommand. Included from
# bench/CMakeLists.txt and from the CLI block of the top CMakeLists.txt (whichever comes first
# defines them), so that the tool builds with or without TSNAP_BUILD_BENCH.
include_guard(GLOBAL)

add_library(tsnap_bench_workloads STATIC ${CMAKE_CURRENT_LIST_DIR}/workloads.cpp)
target_link_libraries(tsnap_bench_workloads PUBLIC tsnap_core)
target_include_directories(tsnap_bench_workloads PUBLIC ${CMAKE_CURRENT_LIST_DIR})

# The only translation unit of the benchmarks that includes <torch/serialize.h>.
add_library(tsnap_bench_measure STATIC ${CMAKE_CURRENT_LIST_DIR}/measure.cpp)
target_include_directories(tsnap_bench_measure
  PUBLIC ${CMAKE_CURRENT_LIST_DIR} PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(tsnap_bench_measure PUBLIC tsnap_bench_workloads PRIVATE Boost::headers)
