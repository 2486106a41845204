#include "pipeline/root_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "common/sys_error.h"
#include "format/layout.h"
#include "io/engine.h"
#include "pipeline/commit.h"

namespace tsnap::pipeline {
namespace {

namespace fs = std::filesystem;

int flock_retry(int fd, int op) {
  int rc;
  do {
    rc = ::flock(fd, op);
  } while (rc < 0 && errno == EINTR);
  return rc < 0 ? -errno : 0;
}

int remove_temporaries(const fs::path& root) {
  int removed = 0;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(io::kDirectProbePrefix, 0) == 0 && entry.is_regular_file(ec) &&
        !entry.is_symlink(ec)) {
      ::unlink(entry.path().c_str());  // a probe file of a writer killed while probing
      continue;
    }
    if (!format::is_temporary(name)) continue;
    if (!entry.is_directory(ec) || entry.is_symlink(ec)) continue;
    remove_temporary(entry.path().string());
    ++removed;
  }
  return removed;
}

}  // namespace

RootLock::RootLock(const fs::path& root) {
  int err = 0;
  fd_ = io::open_fd(root.string(), O_RDONLY | O_DIRECTORY, 0, &err);
  if (err < 0) detail::throw_sys_error(err, "open snapshot root " + root.string());
  int rc = flock_retry(fd_.get(), LOCK_EX | LOCK_NB);
  if (rc == 0) {
    removed_ = remove_temporaries(root);
    // A downgrade is not atomic: another writer may take the exclusive lock in between and
    // clean up, which is harmless, since this one has no temporary yet.
    rc = flock_retry(fd_.get(), LOCK_SH);
  } else if (rc == -EWOULDBLOCK) {
    rc = flock_retry(fd_.get(), LOCK_SH);
  }
  locked_ = rc == 0;
}

}  // namespace tsnap::pipeline
