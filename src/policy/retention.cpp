#include "policy/retention.h"

#include <cerrno>
#include <cstdio>
#include <map>
#include <system_error>

#include "format/layout.h"
#include "pipeline/remove.h"
#include "tsnap/catalog.h"

namespace tsnap::policy {
namespace {

namespace fs = std::filesystem;

}  // namespace

std::vector<std::string> apply_retention(const fs::path& root, const Schedule& schedule,
                                         int64_t newest_step, const RetentionProbe& probe) {
  std::vector<std::string> deleted;
  if (schedule.options().keep_last == 0) return deleted;
  std::map<int64_t, fs::path> committed;
  for (const Listed& l : list(root)) {
    const std::optional<int64_t> step = format::parse_step_name(l.name);
    if (l.committed && step && *step <= newest_step) committed.emplace(*step, l.path);
  }
  std::vector<int64_t> steps;
  for (const auto& [step, path] : committed) steps.push_back(step);
  for (int64_t step : schedule.expired(std::move(steps))) {
    const fs::path& path = committed.at(step);
    const std::string name = path.filename().string();
    if (probe) probe(RetentionPoint::kBeforeRename, path);
    const fs::path temporary = pipeline::remove_snapshot(path, [&](const fs::path& renamed) {
      if (probe) probe(RetentionPoint::kRenamed, renamed);
    });
    if (probe) probe(RetentionPoint::kRemoved, temporary);
    deleted.push_back(name);
  }
  return deleted;
}

}  // namespace tsnap::policy
