#pragma once
// The file primitives the rest of tsnap builds on: an owning descriptor (closed exactly once,
// on every path, throw paths included) and a full positional read.
// Thread-safety: a UniqueFd is used by one owner; read_full may run concurrently on one fd.

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace tsnap::io {

/// AT_FDCWD (checked in fd.cpp), so that this header needs no <fcntl.h>.
inline constexpr int kAtCwd = -100;

/// Owns a file descriptor; closes it on destruction. Move-only. -1 (or any negative) is empty.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  /// Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  /// Closes the current descriptor (its close result is ignored: use close() to see it) and
  /// takes `fd`.
  void reset(int fd = -1);
  /// Closes now and returns 0 or -errno (a descriptor opened for writing reports deferred
  /// write errors here).
  int close();

 private:
  int fd_ = -1;
};

/// openat(2) with O_CLOEXEC, retried on EINTR: the descriptor, or an empty one and `*err` set
/// to -errno. `path` is relative to `dirfd` (AT_FDCWD: the working directory) unless absolute.
UniqueFd open_fd(const std::string& path, int flags, mode_t mode, int* err, int dirfd = kAtCwd);

/// Opens `path` read-only (plus `extra_flags`, e.g. O_DIRECT) the way snapshot files are
/// opened: never following a symbolic link in the last component (-ELOOP), never blocking on a
/// FIFO or device (O_NONBLOCK, cleared again for regular files), and `*st` set by fstat so the
/// caller can refuse anything but a regular file. On failure the fd is empty and `*err` -errno.
UniqueFd open_for_reading(const std::string& path, int extra_flags, struct stat* st, int* err,
                          int dirfd = kAtCwd);

/// Reads `len` bytes at `offset` with pread, retrying EINTR and short reads. Returns the bytes
/// read (fewer than `len` only at end of file) or -errno.
int64_t read_full(int fd, void* buf, size_t len, uint64_t offset);

/// An exclusive flock(2) on a descriptor, held for the guard's life and released with LOCK_UN
/// (not just by closing: a process forked meanwhile shares the open file description and would
/// otherwise keep the lock while it lives). Non-copyable.
class FileLock {
 public:
  /// Takes the lock on `fd`: waits for it, or with `try_only` gives up at once when another
  /// description holds it. locked() says whether it was taken; error() is the errno if not.
  FileLock(int fd, bool try_only);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool locked() const { return error_ == 0; }
  /// 0 when locked; EWOULDBLOCK when another holds it (try_only); else flock's errno.
  int error() const { return error_; }

 private:
  int fd_;
  int error_;
};

}  // namespace tsnap::io
