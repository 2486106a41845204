#pragma once
/// \file
/// The writer lock of a snapshot root, and the removal of stale temporary directories.
///
/// Every writer on a root (each Snapshotter) holds a shared `flock` on the root directory itself
/// for its lifetime (no lock file: nothing is added to the root, and there is no unlink race). A
/// temporary directory (`.<name>.tmp-<id>`) belongs to a writer that is either alive, and then
/// holds that lock, or dead (crashed, killed), and then holds nothing, since the kernel drops a
/// process's locks when it exits. So when a new writer gets the lock *exclusively*
/// (LOCK_EX | LOCK_NB), no live writer exists and every tsnap temporary under the root is stale:
/// it removes them, then downgrades to a shared lock. When the exclusive lock is refused, another
/// writer is alive and may still be writing one of the temporaries: nothing is removed (the next
/// writer that starts alone cleans up). flock locks belong to the open file description, so two
/// Snapshotters in one process exclude each other as two processes do; a forked child shares its
/// parent's lock until it exits or execs (the descriptor is close-on-exec).
///
/// Only entries named like tsnap's own temporaries are removed (`format::is_temporary`:
/// `.<name>.tmp-<id>` directories whose id has the form of a save id).
///
/// Where flock is refused (some network filesystems refuse it on directories), the writer runs
/// without the lock and removes nothing: a live writer's temporary is never at risk.

#include <filesystem>
#include <string>

#include "io/fd.h"

namespace tsnap::pipeline {

/// Holds the shared writer lock of a root; see the file comment.
/// Thread-safety: immutable after construction. Ownership: owns a descriptor of the root; the
/// lock is released on destruction (or when the process dies).
class RootLock {
 public:
  /// Locks `root` (an existing directory); when no other writer holds it, first removes every
  /// stale temporary directory under it. Blocks only while another writer is itself removing
  /// stale temporaries. Errors: IoError naming the root and errno when it cannot be opened.
  explicit RootLock(const std::filesystem::path& root);
  RootLock(const RootLock&) = delete;
  RootLock& operator=(const RootLock&) = delete;

  /// Whether the lock is held (false where flock is not supported).
  bool locked() const { return locked_; }
  /// How many stale temporary directories the constructor removed.
  int removed() const { return removed_; }

 private:
  io::UniqueFd fd_;
  bool locked_ = false;
  int removed_ = 0;
};

}  // namespace tsnap::pipeline
