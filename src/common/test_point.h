#pragma once
// Test points (rocksdb's sync points, reduced to one callback): library code marks a moment of a
// crash-relevant sequence that does not go through the io engine, whose calls tests intercept
// with io::ScopedEngineOverride instead. A test installs a callback that sees each point, e.g.
// to kill the process there (tests/crash/soak_test.cpp). The points:
//   "remove_tree"  before each file or directory remove_tree deletes: the removal of a stale
//                  temporary at start-up, of a snapshot expired by retention, of an overwritten
//                  snapshot, of a failed save's temporary directory.
//   "reuse_link"   before an incremental save hard-links a base file (from its proven
//                  descriptor) into its temporary directory (pipeline/reuse.cpp).
//   "reuse_copy"   before an incremental save copies a base file's unchanged byte ranges.
//   "reuse_linked" after an incremental save hard-linked one of its shard files to the base
//                  snapshot's file (a file whose every chunk was unchanged), before the save
//                  commits (pipeline/reuse.cpp).
//   "reuse_copied" after the kernel copied a base file's unchanged byte ranges into one of the
//                  save's shard files (a partly changed file, or a whole file where the link
//                  was refused), before that file is fsynced.
// Without a callback a point costs one relaxed atomic load.
// Thread-safety: points may be passed on any thread; the callback is called on that thread and
// must be thread-safe. Setting it is not synchronised with points in flight: set it before the
// library is used.

namespace tsnap::detail {

/// Receives the name of each test point passed (a string literal).
using TestPointCallback = void (*)(const char* point);

/// Installs `callback` for every later test point of the process (nullptr: none).
void set_test_point_callback(TestPointCallback callback) noexcept;

/// Calls the installed callback with `point`, if there is one.
void test_point(const char* point) noexcept;

}  // namespace tsnap::detail
