#include "tsnap/remove.h"

#include "common/remove_tree.h"
#include "common/sys_error.h"
#include "format/storage_root.h"

namespace tsnap {
void remove_snapshot(const std::filesystem::path& snapshot) {
  const auto [root, name] = format::StorageRoot::of_snapshot(snapshot);
  root->remove(name);
}

void remove_tree(const std::filesystem::path& path) {
  const int rc = detail::remove_tree(path.string());
  if (rc < 0) detail::throw_sys_error(rc, "remove " + path.string());
}

}  // namespace tsnap
