#include "pipeline/remove.h"

#include <stdio.h>

#include <cerrno>

#include "common/remove_tree.h"
#include "common/sys_error.h"
#include "format/layout.h"
#include "format/s3_root.h"
#include "tsnap/error.h"
#include "tsnap/remove.h"

namespace tsnap {
namespace pipeline {

namespace fs = std::filesystem;

fs::path remove_snapshot(const fs::path& snapshot,
                         const std::function<void(const fs::path&)>& renamed) {
  const fs::path temporary =
      snapshot.parent_path() /
      format::temporary_name(snapshot.filename().string(), format::new_save_id());
  if (::rename(snapshot.c_str(), temporary.c_str()) != 0) {
    const int e = errno;
    if (e == ENOENT) {
      throw_error(ErrorCode::kNotFound, "snapshot " + snapshot.string() + " does not exist", e);
    }
    detail::throw_sys_error(-e, "rename " + snapshot.string() + " to " + temporary.string());
  }
  if (renamed) renamed(temporary);
  (void)detail::remove_tree(temporary.string());
  return temporary;
}

}  // namespace pipeline

void remove_snapshot(const std::filesystem::path& snapshot) {
  if (format::is_s3(snapshot)) {
    const auto [root, name] = format::S3Root::of_snapshot(snapshot.native());
    root.remove(name);
    return;
  }
  pipeline::remove_snapshot(snapshot);
}

void remove_tree(const std::filesystem::path& path) {
  const int rc = detail::remove_tree(path.string());
  if (rc < 0) detail::throw_sys_error(rc, "remove " + path.string());
}

}  // namespace tsnap
