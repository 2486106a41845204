#include "common/remove_tree.h"

#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>

#include <cerrno>

#include "common/test_point.h"

namespace tsnap::detail {
namespace {

thread_local int first_error = 0;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  test_point("remove_tree");
  if (::remove(path) != 0 && errno != ENOENT && first_error == 0) first_error = -errno;
  return 0;  // keep going: remove as much as possible
}

}  // namespace

int remove_tree(const std::string& path) noexcept {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? 0 : -errno;
  first_error = 0;
  if (nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && first_error == 0) {
    first_error = -errno;
  }
  return first_error;
}

}  // namespace tsnap::detail
