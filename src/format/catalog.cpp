#include "tsnap/catalog.h"

#include <algorithm>
#include <system_error>

#include "format/layout.h"
#include "format/s3_root.h"
#include "tsnap/error.h"

namespace tsnap {

namespace fs = std::filesystem;

std::vector<Listed> list(const fs::path& root) {
  if (format::is_s3(root)) return format::S3Root(root.native()).list();
  std::vector<Listed> out;
  std::error_code ec;
  if (!fs::exists(root, ec)) return out;
  fs::directory_iterator it(root, ec);
  if (ec) {
    throw_error(ErrorCode::kIo, "cannot list " + root.string() + ": " + ec.message(), ec.value());
  }
  std::vector<std::pair<int64_t, Listed>> sorted;
  for (const fs::directory_entry& entry : it) {
    if (!entry.is_directory(ec)) continue;
    Listed l;
    l.path = entry.path();
    l.name = entry.path().filename().string();
    l.temporary = format::looks_temporary(l.name);
    int64_t when = 0;
    if (!l.temporary) {
      try {
        l.manifest = read_manifest(l.path);
        l.committed = true;
        when = l.manifest->created_unix_ns;
      } catch (const Error& e) {
        l.problem = e.what();
      }
    } else {
      l.problem = "temporary directory of an unfinished save";
    }
    if (!l.committed) {
      const auto t = fs::last_write_time(l.path, ec);
      if (!ec) {
        when = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
      }
    }
    sorted.emplace_back(when, std::move(l));
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.name < b.second.name;
  });
  for (auto& [when, l] : sorted) out.push_back(std::move(l));
  return out;
}

std::optional<fs::path> latest(const fs::path& root) {
  std::optional<fs::path> best;
  format::SnapshotAge best_age;
  for (const Listed& l : list(root)) {
    if (!l.committed) continue;
    const format::SnapshotAge age{format::step_of(l.manifest->metadata),
                                  l.manifest->created_unix_ns};
    if (!best || format::newer(age, best_age)) {
      best = l.path;
      best_age = age;
    }
  }
  return best;
}

}  // namespace tsnap
