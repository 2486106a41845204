#include "policy/retention.h"

#include <cerrno>
#include <cstdio>
#include <map>
#include <system_error>

#include "common/sys_error.h"
#include "pipeline/commit.h"
#include "policy/root_lock.h"
#include "tsnap/catalog.h"

namespace tsnap::policy {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "step-";

}  // namespace

std::string snapshot_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%08lld", kPrefix, static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> parse_snapshot_name(const std::string& name) {
  const size_t n = std::char_traits<char>::length(kPrefix);
  if (name.size() <= n || name.size() > n + 18 || name.compare(0, n, kPrefix) != 0) {
    return std::nullopt;
  }
  int64_t step = 0;
  for (size_t i = n; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  if (snapshot_name(step) != name) return std::nullopt;  // one spelling per step
  return step;
}

std::vector<std::string> apply_retention(const fs::path& root, const Schedule& schedule,
                                         int64_t newest_step, const RetentionProbe& probe) {
  std::vector<std::string> deleted;
  if (schedule.options().keep_last == 0) return deleted;
  std::map<int64_t, fs::path> committed;
  for (const Listed& l : list(root)) {
    const std::optional<int64_t> step = parse_snapshot_name(l.name);
    if (l.committed && step && *step <= newest_step) committed.emplace(*step, l.path);
  }
  std::vector<int64_t> steps;
  for (const auto& [step, path] : committed) steps.push_back(step);
  for (int64_t step : schedule.expired(std::move(steps))) {
    const fs::path& path = committed.at(step);
    const std::string name = path.filename().string();
    if (probe) probe(RetentionPoint::kBeforeRename, path);
    const fs::path temporary = root / pipeline::temporary_name(name, temporary_id());
    if (::rename(path.c_str(), temporary.c_str()) != 0) {
      detail::throw_sys_error(-errno, "rename " + path.string() + " to " + temporary.string());
    }
    if (probe) probe(RetentionPoint::kRenamed, temporary);
    pipeline::remove_temporary(temporary.string());
    if (probe) probe(RetentionPoint::kRemoved, temporary);
    deleted.push_back(name);
  }
  return deleted;
}

}  // namespace tsnap::policy
