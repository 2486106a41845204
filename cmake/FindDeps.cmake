# liburing and xxHash, found by header and library (no pkg-config needed), as the interface
# targets tsnap_uring and tsnap_xxhash. Private to the build: never exported.
find_path(TSNAP_URING_INCLUDE_DIR liburing.h REQUIRED)
find_library(TSNAP_URING_LIBRARY NAMES uring REQUIRED)
add_library(tsnap_uring INTERFACE)
target_include_directories(tsnap_uring INTERFACE ${TSNAP_URING_INCLUDE_DIR})
target_link_libraries(tsnap_uring INTERFACE ${TSNAP_URING_LIBRARY})

# xxHash is used header-only (XXH_INLINE_ALL): no library to link.
find_path(TSNAP_XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
add_library(tsnap_xxhash INTERFACE)
target_include_directories(tsnap_xxhash INTERFACE ${TSNAP_XXHASH_INCLUDE_DIR})
