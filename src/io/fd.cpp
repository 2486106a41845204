#include "io/fd.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

namespace tsnap::io {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

int UniqueFd::close() {
  if (fd_ < 0) return 0;
  const int rc = ::close(release());
  return rc < 0 ? -errno : 0;
}

static_assert(AT_FDCWD == kAtCwd, "kAtCwd must be AT_FDCWD");

UniqueFd open_fd(const std::string& path, int flags, mode_t mode, int* err, int dirfd) {
  int fd;
  do {
    fd = ::openat(dirfd, path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  *err = fd < 0 ? -errno : 0;
  return UniqueFd(fd);
}

UniqueFd open_for_reading(const std::string& path, int extra_flags, struct stat* st, int* err,
                          int dirfd) {
  UniqueFd fd = open_fd(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | extra_flags, 0, err, dirfd);
  if (!fd.valid()) return fd;
  if (::fstat(fd.get(), st) != 0) {
    *err = -errno;
    return UniqueFd();
  }
  if (S_ISREG(st->st_mode)) {
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
      *err = -errno;
      return UniqueFd();
    }
  }
  *err = 0;
  return fd;
}

int64_t read_full(int fd, void* buf, size_t len, uint64_t offset) {
  auto* out = static_cast<char*>(buf);
  size_t got = 0;
  while (got < len) {
    const ssize_t n = ::pread(fd, out + got, len - got, static_cast<off_t>(offset + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  return static_cast<int64_t>(got);
}

FileLock::FileLock(int fd, bool try_only)
    : fd_(fd), error_(::flock(fd, LOCK_EX | (try_only ? LOCK_NB : 0)) == 0 ? 0 : errno) {}

FileLock::~FileLock() {
  if (error_ == 0) (void)::flock(fd_, LOCK_UN);
}

}  // namespace tsnap::io
