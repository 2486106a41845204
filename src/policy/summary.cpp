#include "policy/summary.h"

#include <cstdarg>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace tsnap::policy {
namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

constexpr double kMs = 1e3;
constexpr double kMB = 1e6;

}  // namespace

std::string snapshot_line(const SnapshotRecord& r) {
  const std::string head = "tsnap: " + r.name;
  if (!r.committed) {
    return head + " FAILED (" + to_string(r.reason) + "): " + r.error;
  }
  const SaveStats& s = r.save;
  std::string line =
      head + format(
                 " committed (%s): %.1f MB, blocked %.1f ms (stall %.1f ms, stage %.1f ms), "
                 "write %.1f ms, commit %.1f ms, total %.1f ms, %.2f GB/s, %s%s",
                 to_string(r.reason), s.bytes / kMB, r.blocked_s * kMs, s.stall_s * kMs,
                 s.stage_s * kMs, s.write_s * kMs, s.commit_s * kMs, s.total_s * kMs,
                 s.throughput_gbps(), s.engine.c_str(), s.direct ? "+O_DIRECT" : "");
  if (s.buffer_waits > 0) {
    line += format(
        "; waited %llu times for staging buffers (the snapshot is larger than the "
        "staging budget)",
        static_cast<unsigned long long>(s.buffer_waits));
  }
  if (!s.unchanged_since.empty()) {
    line += format("; %llu of %llu tensors unchanged since %s",
                   static_cast<unsigned long long>(s.unchanged_tensors),
                   static_cast<unsigned long long>(s.tensors), s.unchanged_since.c_str());
  }
  if (!s.stale.empty()) {
    line += format(
        "; WARNING: %zu tensors that training changes at every step did not change "
        "since %s although the step advanced (stale state?): ",
        s.stale.size(), s.unchanged_since.c_str());
    for (size_t i = 0; i < s.stale.size() && i < 3; ++i) line += (i ? ", " : "") + s.stale[i];
    if (s.stale.size() > 3) line += ", ...";
  }
  for (size_t i = 0; i < r.deleted.size(); ++i) {
    line += (i == 0 ? "; deleted " : ", ") + r.deleted[i];
  }
  if (!s.leftover.empty()) {
    line += "; could not remove the replaced snapshot, left as " + s.leftover;
  }
  return line;
}

std::string summary_line(const PeriodicStats& stats) {
  const size_t n = stats.snapshots.size();
  const double stall = stats.stall_s();
  return format(
      "tsnap: %zu snapshots (%zu committed, %lld failed), %lld skipped, %lld deleted; "
      "training blocked %.1f ms in total (%.1f ms per snapshot), %.1f MB written",
      n, n - static_cast<size_t>(stats.failed), static_cast<long long>(stats.failed),
      static_cast<long long>(stats.skipped), static_cast<long long>(stats.deleted), stall * kMs,
      n ? stall * kMs / static_cast<double>(n) : 0.0, static_cast<double>(stats.bytes()) / kMB);
}

}  // namespace tsnap::policy

namespace tsnap {

void to_json(nlohmann::json& out, const SnapshotRecord& r) {
  out = {{"step", r.step},
         {"name", r.name},
         {"reason", to_string(r.reason)},
         {"blocked_s", r.blocked_s},
         {"committed", r.committed},
         {"error", r.error},
         {"deleted", r.deleted},
         {"save", r.save}};
}

}  // namespace tsnap
