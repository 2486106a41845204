#include "tsnap/catalog.h"

#include <algorithm>
#include <system_error>

#include "format/layout.h"
#include "format/storage_root.h"
#include "tsnap/error.h"

namespace tsnap {

namespace fs = std::filesystem;

std::vector<Listed> list(const fs::path& root) { return format::StorageRoot::open(root)->list(); }

std::optional<fs::path> latest(const fs::path& root) {
  std::optional<fs::path> best;
  format::SnapshotAge best_age;
  for (const Listed& l : list(root)) {
    if (!l.committed) continue;
    const format::SnapshotAge age = format::age_of(*l.manifest);
    if (!best || format::newer(age, best_age)) {
      best = l.path;
      best_age = age;
    }
  }
  return best;
}

}  // namespace tsnap
