#pragma once
// The process that owns tsnap's background threads. fork() copies memory but not threads: in a
// forked child, a Snapshotter's io thread, pool and drain do not exist, so a save would never
// complete and a destructor would wait for threads forever. Objects that own threads record
// their process when built and refuse to work in another one (a clear error instead of a hang),
// and their destructors leave the copied state alone there.

#include <sys/types.h>

namespace tsnap::detail {

/// Thread-safety: immutable once built.
class OwnerProcess {
 public:
  OwnerProcess();
  /// True in a process forked from the owner.
  bool forked() const;
  /// Throws Error(kUnsupported) naming `what`, both pids and what to do, when forked().
  void check(const char* what) const;

 private:
  pid_t pid_;
};

}  // namespace tsnap::detail
