#pragma once
// The file primitives the rest of tsnap builds on: an owning descriptor (closed exactly once,
// on every path, throw paths included) and a full positional read.
// Thread-safety: a UniqueFd is used by one owner; read_full may run concurrently on one fd.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace tsnap::io {

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

/// open(2) with O_CLOEXEC, retried on EINTR: the descriptor, or an empty one and `*err` set to
/// -errno.
UniqueFd open_fd(const std::string& path, int flags, mode_t mode, int* err);

/// Reads `len` bytes at `offset` with pread, retrying EINTR and short reads. Returns the bytes
/// read (fewer than `len` only at end of file) or -errno.
int64_t read_full(int fd, void* buf, size_t len, uint64_t offset);

}  // namespace tsnap::io
