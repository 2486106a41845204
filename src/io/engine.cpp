#include "io/engine.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace tsnap::io {
namespace {

int result(int rc) { return rc < 0 ? -errno : rc; }

}  // namespace

// `done` by value, as the interface takes it (the io_uring engine keeps its callbacks).
void Engine::readv(int fd, const iovec* iov, int iovcnt, uint64_t offset,
                   Done done) {  // NOLINT(performance-unnecessary-value-param)
  std::vector<iovec> rest(iov, iov + iovcnt);
  size_t first = 0;
  uint64_t got = 0;
  while (first < rest.size()) {
    const ssize_t n = ::preadv(fd, rest.data() + first, static_cast<int>(rest.size() - first),
                               static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return done(-errno);
    if (n == 0) break;  // end of file
    got += static_cast<uint64_t>(n);
    // Past the segments it filled; on into the one it stopped in.
    for (size_t left = static_cast<size_t>(n); left > 0;) {
      if (left >= rest[first].iov_len) {
        left -= rest[first++].iov_len;
      } else {
        rest[first].iov_base = static_cast<uint8_t*>(rest[first].iov_base) + left;
        rest[first].iov_len -= left;
        left = 0;
      }
    }
  }
  done(static_cast<int>(got));
}

int Engine::open(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return result(fd);
}

int Engine::close(int fd) { return result(::close(fd)); }
int Engine::fsync(int fd) { return result(::fsync(fd)); }
int Engine::ftruncate(int fd, uint64_t size) {
  return result(::ftruncate(fd, static_cast<off_t>(size)));
}
int Engine::mkdir(const std::string& path) { return result(::mkdir(path.c_str(), 0755)); }

int Engine::rename(const std::string& from, const std::string& to, RenameMode mode) {
  const unsigned flags = mode == RenameMode::kExchange ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  return result(::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags));
}

int Engine::fsync_dir(const std::string& path) {
  const int fd = open(path, O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0) return fd;
  const int rc = fsync(fd);
  close(fd);
  return rc;
}

int write_and_wait(Engine& engine, int fd, const void* buf, size_t len, uint64_t offset) {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  int rc = 0;
  engine.write(fd, buf, len, offset, -1, [&](int r) {
    std::lock_guard<std::mutex> lock(mu);
    rc = r;
    finished = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished; });
  return rc;
}

namespace {

// A probe file: unnamed (O_TMPFILE) where the filesystem allows it, so a process killed while
// probing leaves nothing behind; else a named one, which the next writer alone on the root
// removes (kDirectProbePrefix). -errno when neither can be created.
int open_probe(Engine& engine, const std::string& dir, std::string* named) {
  const int fd = engine.open(dir, O_TMPFILE | O_WRONLY, 0600);
  if (fd >= 0) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_DIRECT) == 0) return fd;
    engine.close(fd);
    return -EINVAL;  // the filesystem refuses O_DIRECT
  }
  *named = dir + "/" + kDirectProbePrefix + std::to_string(::getpid());
  return engine.open(*named, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
}

}  // namespace

bool probe_direct_io(Engine& engine, const std::string& dir) {
  std::string named;
  const int fd = open_probe(engine, dir, &named);
  if (fd < 0) {
    if (!named.empty()) ::unlink(named.c_str());
    return false;
  }
  void* buf = nullptr;
  bool ok = false;
  if (posix_memalign(&buf, 4096, 4096) == 0) {
    std::memset(buf, 0, 4096);
    ok = write_and_wait(engine, fd, buf, 4096, 0) == 0;
    std::free(buf);
  }
  engine.close(fd);
  if (!named.empty()) ::unlink(named.c_str());
  return ok;
}

}  // namespace tsnap::io
