#include "policy/retention.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <map>
#include <system_error>

#include "format/layout.h"
#include "format/storage_root.h"
#include "tsnap/catalog.h"

namespace tsnap::policy {
namespace {

namespace fs = std::filesystem;

// What the schedule's rules need of a committed snapshot: its step, creation time and metric.
SnapshotFacts facts_of(int64_t step, const Manifest& m, const std::string& metric) {
  SnapshotFacts f;
  f.step = step;
  f.created_s = static_cast<double>(m.created_unix_ns) / 1e9;
  if (!metric.empty() && m.metadata.is_object()) {
    auto it = m.metadata.find(metric);
    // A NaN or infinite metric (a diverged run's loss) ranks as none.
    if (it != m.metadata.end() && it->is_number() && std::isfinite(it->get<double>())) {
      f.metric = it->get<double>();
    }
  }
  return f;
}

}  // namespace

std::vector<std::string> apply_retention(
    const fs::path& root, const Schedule& schedule, int64_t newest_step,
    const RetentionProbe& probe, const std::function<bool(const std::string&)>& may_delete) {
  std::vector<std::string> deleted;
  if (!schedule.retains()) return deleted;
  std::map<int64_t, fs::path> committed;
  std::vector<SnapshotFacts> facts;
  for (const Listed& l : list(root)) {
    const std::optional<int64_t> step = format::parse_step_name(l.name);
    if (l.committed && step && *step <= newest_step && committed.emplace(*step, l.path).second) {
      facts.push_back(facts_of(*step, *l.manifest, schedule.options().best_metric));
    }
  }
  const std::unique_ptr<format::StorageRoot> store = format::StorageRoot::open(root);
  for (int64_t step : schedule.expired(std::move(facts))) {
    const fs::path& path = committed.at(step);
    const std::string name = path.filename().string();
    if (may_delete && !may_delete(name)) continue;
    if (probe) probe(RetentionPoint::kBeforeRename, path);
    const fs::path unlisted = store->remove(name, [&](const fs::path& where) {
      if (probe) probe(RetentionPoint::kRenamed, where);
    });
    if (probe) probe(RetentionPoint::kRemoved, unlisted);
    deleted.push_back(name);
  }
  return deleted;
}

}  // namespace tsnap::policy
