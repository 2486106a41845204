#include "policy/root_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <system_error>

#include "common/sys_error.h"
#include "pipeline/commit.h"

namespace tsnap::policy {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTmp = ".tmp-";

int flock_retry(int fd, int op) {
  int rc;
  do {
    rc = ::flock(fd, op);
  } while (rc < 0 && errno == EINTR);
  return rc < 0 ? -errno : 0;
}

bool is_hex(const std::string& s, size_t begin, size_t count) {
  for (size_t i = begin; i < begin + count; ++i) {
    const char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

int remove_temporaries(const fs::path& root) {
  int removed = 0;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    if (!is_tsnap_temporary(entry.path().filename().string())) continue;
    if (!entry.is_directory(ec) || entry.is_symlink(ec)) continue;
    pipeline::remove_temporary(entry.path().string());
    ++removed;
  }
  return removed;
}

}  // namespace

std::string temporary_id() {
  static std::atomic<uint32_t> counter{0};
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  const uint32_t low = static_cast<uint32_t>(::getpid()) * 2654435761u + counter++;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx-%08x", static_cast<unsigned long long>(ns), low);
  return buf;
}

bool is_tsnap_temporary(const std::string& entry) {
  const size_t at = entry.rfind(kTmp);
  const size_t id = at + std::char_traits<char>::length(kTmp);
  return pipeline::is_temporary_name(entry) && at != std::string::npos && at > 1 &&
         entry.size() == id + 25 && is_hex(entry, id, 16) && entry[id + 16] == '-' &&
         is_hex(entry, id + 17, 8);
}

RootLock::RootLock(const fs::path& root) {
  fd_ = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) detail::throw_sys_error(-errno, "open snapshot root " + root.string());
  int rc = flock_retry(fd_, LOCK_EX | LOCK_NB);
  if (rc == 0) {
    removed_ = remove_temporaries(root);
    // A downgrade is not atomic: another writer may take the exclusive lock in between and
    // clean up, which is harmless, since this one has no temporary yet.
    rc = flock_retry(fd_, LOCK_SH);
  } else if (rc == -EWOULDBLOCK) {
    rc = flock_retry(fd_, LOCK_SH);
  }
  locked_ = rc == 0;
}

RootLock::~RootLock() { ::close(fd_); }

}  // namespace tsnap::policy
