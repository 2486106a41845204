#include "pipeline/reuse.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "common/sys_error.h"
#include "common/test_point.h"
#include "format/hash.h"
#include "tsnap/error.h"

namespace tsnap::pipeline {
namespace {

// copy_file_range of [offset, offset + len) from `in` to `out`, at the same offsets; falls
// back to pread/pwrite where the kernel refuses it (EXDEV on old kernels, EINVAL, ENOSYS).
int copy_range(int in, int out, uint64_t offset, uint64_t len) {
  while (len > 0) {
    loff_t off_in = static_cast<loff_t>(offset), off_out = static_cast<loff_t>(offset);
    const ssize_t n = ::copy_file_range(in, &off_in, out, &off_out, len, 0);
    if (n > 0) {
      offset += static_cast<uint64_t>(n);
      len -= static_cast<uint64_t>(n);
      continue;
    }
    if (n == 0) return -EIO;  // the base file ended early: changed under us
    if (errno == EINTR) continue;
    if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
      return -errno;
    }
    char buf[1 << 16];
    while (len > 0) {
      const int64_t got = io::read_full(in, buf, std::min<uint64_t>(len, sizeof buf), offset);
      if (got < 0) return static_cast<int>(got);
      if (got == 0) return -EIO;
      for (int64_t done = 0; done < got;) {
        const ssize_t w = ::pwrite(out, buf + done, static_cast<size_t>(got - done),
                                   static_cast<off_t>(offset + done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -errno;
        done += w;
      }
      offset += static_cast<uint64_t>(got);
      len -= static_cast<uint64_t>(got);
    }
  }
  return 0;
}

// Whether bytes [begin, end) of `fd` hash (XXH3-64) to `hash`; false on a read error or a short
// file.
bool range_hashes_to(int fd, uint64_t begin, uint64_t end, uint64_t hash) {
  constexpr size_t kPiece = 1 << 20;
  static thread_local std::unique_ptr<uint8_t[]> buf(new uint8_t[kPiece]);
  format::Hash64Stream h;
  for (uint64_t at = begin; at < end;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPiece, end - at));
    if (io::read_full(fd, buf.get(), n, at) != static_cast<int64_t>(n)) return false;
    h.update(buf.get(), n);
    at += n;
  }
  return h.digest() == hash;
}

}  // namespace

BaseFile::BaseFile(std::string path, uint64_t size) : path_(std::move(path)), size_(size) {
  struct stat st {};
  int err = 0;
  io::UniqueFd fd = io::open_for_reading(path_, 0, &st, &err);
  if (!fd.valid() || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != size_) return;
  fd_ = std::move(fd);
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  mtime_ = st.st_mtim;
}

bool BaseFile::unmodified_since_opened() const {
  struct stat st {};
  return ::fstat(fd_.get(), &st) == 0 && static_cast<uint64_t>(st.st_size) == size_ &&
         st.st_mtim.tv_sec == mtime_.tv_sec && st.st_mtim.tv_nsec == mtime_.tv_nsec;
}

bool BaseFile::holds(uint64_t begin, uint64_t end, uint64_t hash) const {
  return range_hashes_to(fd_.get(), begin, end, hash);
}

bool BaseFile::link_descriptor(const std::string& target) const {
  detail::test_point("reuse_link");
  // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; /proc/self/fd/N (followed) links the same inode
  // for anyone. Either way the file linked is the one proven, whatever its path names now. A
  // file deleted meanwhile (no links left) cannot be linked again: it is copied instead.
  bool linked = ::linkat(fd_.get(), "", AT_FDCWD, target.c_str(), AT_EMPTY_PATH) == 0;
  if (!linked) {
    const std::string proc = "/proc/self/fd/" + std::to_string(fd_.get());
    linked = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, target.c_str(), AT_SYMLINK_FOLLOW) == 0;
  }
  if (!linked) return false;
  struct stat st {};
  if (::lstat(target.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) return true;
  ::unlink(target.c_str());  // not the proven file after all (never expected): copy instead
  return false;
}

bool BaseFile::link_or_copy(const std::string& target) const {
  if (link_descriptor(target)) {
    detail::test_point("reuse_linked");
    return true;
  }
  int err = 0;
  io::UniqueFd out = io::open_fd(target, O_WRONLY | O_CREAT | O_EXCL, 0644, &err);
  if (!out.valid()) detail::throw_sys_error(err, "create " + target);
  copy_ranges_to(out.get(), target, {{0, size_}});
  return false;
}

void BaseFile::copy_ranges(const std::string& target,
                           const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const {
  int err = 0;
  io::UniqueFd out = io::open_fd(target, O_WRONLY, 0, &err);
  if (!out.valid()) detail::throw_sys_error(err, "open " + target);
  copy_ranges_to(out.get(), target, ranges);
}

void BaseFile::check_reused(const std::string& target, const std::vector<Chunk>& chunks) const {
  struct stat st {};
  int err = 0;
  io::UniqueFd in = io::open_for_reading(target, 0, &st, &err);
  if (!in.valid()) detail::throw_sys_error(err, "open " + target + " to check its reused chunks");
  for (const Chunk& c : chunks) {
    if (!range_hashes_to(in.get(), c.begin, c.end, c.hash)) {
      throw_error(ErrorCode::kHashMismatch,
                  "the base snapshot's file " + path_ + " changed while this save reused it: " +
                      "bytes [" + std::to_string(c.begin) + ", " + std::to_string(c.end) +
                      ") no longer hold what was proven equal; the save is not committed (a "
                      "snapshot's files must not be modified in place)");
    }
  }
}

void BaseFile::copy_ranges_to(int out, const std::string& target,
                              const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const {
  detail::test_point("reuse_copy");
  for (const auto& [begin, end] : ranges) {
    const int rc = copy_range(fd_.get(), out, begin, end - begin);
    if (rc < 0) {
      detail::throw_sys_error(rc, "copy bytes [" + std::to_string(begin) + ", " +
                                      std::to_string(end) + ") of " + path_ + " into " + target);
    }
  }
  detail::test_point("reuse_copied");
  if (::fsync(out) != 0) detail::throw_sys_error(-errno, "fsync " + target);
}

}  // namespace tsnap::pipeline
