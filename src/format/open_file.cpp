#include "format/open_file.h"

#include <fcntl.h>

#include <cerrno>

#include "common/sys_error.h"
#include "tsnap/error.h"

namespace tsnap::format {

SnapshotDir SnapshotDir::open(const std::filesystem::path& path) {
  SnapshotDir dir;
  dir.path = path;
  int err = 0;
  dir.fd = io::open_fd(path.string(), O_RDONLY | O_DIRECTORY, 0, &err);
  if (err == -ENOENT || err == -ENOTDIR) {
    throw_error(
        ErrorCode::kNotFound,
        "snapshot " + path.string() + (err == -ENOENT ? " does not exist" : " is not a directory"),
        -err);
  }
  if (err < 0) detail::throw_sys_error(err, "open snapshot directory " + path.string());
  return dir;
}

bool SnapshotDir::replaced() const {
  struct stat opened {};
  struct stat now {};
  if (::fstat(fd.get(), &opened) != 0) return false;
  if (::stat(path.c_str(), &now) != 0) return true;
  return opened.st_ino != now.st_ino || opened.st_dev != now.st_dev;
}

SnapshotDir SnapshotDir::duplicate() const {
  SnapshotDir copy;
  copy.path = path;
  copy.fd.reset(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!copy.fd.valid()) detail::throw_sys_error(-errno, "duplicate descriptor of " + path.string());
  return copy;
}

OpenedFile open_snapshot_file(int dirfd, const std::string& name, const std::string& label,
                              const std::string& what, int extra_flags) {
  OpenedFile f;
  int err = 0;
  f.fd = io::open_for_reading(name, extra_flags, &f.st, &err, dirfd);
  if (err == -ENOENT) {
    throw_error(ErrorCode::kNotFound, what + " " + label + " does not exist", ENOENT);
  }
  if (err == -ELOOP) {
    throw_error(ErrorCode::kUnsafePath,
                what + " " + label + " is a symbolic link; snapshot files are never links", ELOOP);
  }
  if (err < 0) detail::throw_sys_error(err, "open " + what + " " + label);
  if (!S_ISREG(f.st.st_mode)) {
    throw_error(ErrorCode::kUnsafePath,
                what + " " + label + " is not a regular file (a directory, FIFO or device)");
  }
  return f;
}

}  // namespace tsnap::format
