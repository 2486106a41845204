#include "bench/session.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <iostream>
#include <stdexcept>
#include <system_error>

#include "common/remove_tree.h"
#include "common/text_table.h"

namespace fs = std::filesystem;

namespace tsnap::bench {

WorkDir::WorkDir(const fs::path& target) : target_(target) {
  std::error_code ec;
  fs::create_directories(target, ec);
  if (ec || !fs::is_directory(target)) {
    throw std::runtime_error("cannot use target directory " + target.string() + ": " +
                             (ec ? ec.message() : "not a directory"));
  }
  path_ = target / ("tsnap-bench-" + std::to_string(::getpid()));
  if (!fs::create_directory(path_, ec) || ec) {
    throw std::runtime_error("cannot write to target directory " + target.string() + ": " +
                             (ec ? ec.message() : "already exists: " + path_.string()));
  }
}

WorkDir::~WorkDir() {
  if (!keep_) detail::remove_tree(path_.string());
}

void WorkDir::require_free(uint64_t bytes) const {
  struct statvfs info {};
  if (::statvfs(path_.c_str(), &info) != 0) return;
  const uint64_t free_bytes = static_cast<uint64_t>(info.f_bavail) * info.f_frsize;
  if (free_bytes < bytes) {
    throw std::runtime_error("not enough free space in " + target_.string() +
                             ": the benchmark needs " + detail::human_bytes(bytes) + ", " +
                             detail::human_bytes(free_bytes) + " free");
  }
}

Progress::Progress() : tty_(::isatty(STDERR_FILENO) != 0) {}

void Progress::show(const std::string& text) {
  shown_ = true;
  if (tty_) {
    std::cerr << "\r\033[K" << text << std::flush;
  } else {
    std::cerr << text << '\n';
  }
}

void Progress::done() {
  if (tty_ && shown_) std::cerr << "\r\033[K" << std::flush;
  shown_ = false;
}

}  // namespace tsnap::bench
