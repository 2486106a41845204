#include "format/layout.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "format/hash.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"

namespace tsnap::format {
namespace {

constexpr const char* kTmp = ".tmp-";
constexpr const char* kStepPrefix = "step-";
constexpr size_t kIdLength = 16 + 1 + 8;

bool is_hex(const std::string& s, size_t begin, size_t count) {
  for (size_t i = begin; i < begin + count; ++i) {
    const char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

void check_snapshot_name(const std::string& name) {
  if (name.size() > 200) {
    throw_error(ErrorCode::kInvalidArgument, "invalid snapshot name '" + name.substr(0, 40) +
                                                 "...': it is " + std::to_string(name.size()) +
                                                 " bytes long, more than the 200 a name may have");
  }
  if (name.empty() || name == "." || name == ".." || name[0] == '.' ||
      name.find('/') != std::string::npos || name.find('\0') != std::string::npos ||
      name.size() > 200) {
    throw_error(ErrorCode::kInvalidArgument,
                "invalid snapshot name '" + name +
                    "': use a plain directory name that does not start with '.'");
  }
}

std::string new_save_id() {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(::getpid()) << 32);
  std::lock_guard<std::mutex> lock(mu);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  char buf[48];
  std::snprintf(buf, sizeof buf, "%016llx-%08llx", static_cast<unsigned long long>(ns),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  return buf;
}

std::string group_save_id(const std::string& run, const std::string& name, uint64_t n) {
  if (!is_temporary(temporary_name("x", run))) {
    throw_error(ErrorCode::kInvalidArgument, "'" + run + "' is not a tsnap save id");
  }
  const std::string text = run + '\0' + name + '\0' + std::to_string(n);
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08llx",
                static_cast<unsigned long long>(hash64(text.data(), text.size()) & 0xffffffffu));
  return run.substr(0, 17) + buf;
}

std::string temporary_name(const std::string& name, const std::string& id) {
  return "." + name + kTmp + id;
}

bool looks_temporary(const std::string& entry) {
  return entry.size() > 1 && entry[0] == '.' && entry.find(kTmp) != std::string::npos;
}

bool is_temporary(const std::string& entry) {
  const size_t at = entry.rfind(kTmp);
  if (at == std::string::npos || at < 2 || entry[0] != '.') return false;
  const size_t id = at + std::char_traits<char>::length(kTmp);
  return entry.size() == id + kIdLength && is_hex(entry, id, 16) && entry[id + 16] == '-' &&
         is_hex(entry, id + 17, 8);
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> parse_step_name(const std::string& name) {
  const size_t n = std::char_traits<char>::length(kStepPrefix);
  if (name.size() <= n || name.size() > n + 18 || name.compare(0, n, kStepPrefix) != 0) {
    return std::nullopt;
  }
  int64_t step = 0;
  for (size_t i = n; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  if (step_name(step) != name) return std::nullopt;  // one spelling per step
  return step;
}

std::vector<std::string> optimizer_moment_globs() {
  return {"*/exp_avg", "*/exp_avg_sq", "*/momentum_buffer", "*/square_avg"};
}

std::optional<int64_t> step_of(const nlohmann::json& metadata) {
  if (!metadata.is_object()) return std::nullopt;
  const auto it = metadata.find(kStepKey);
  if (it == metadata.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

std::string utc_timestamp(std::chrono::system_clock::time_point t) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms % 1000));
  return buf;
}

std::optional<int64_t> parse_utc_timestamp(const std::string& text) {
  auto digits = [&](size_t pos, size_t n) {
    if (pos + n > text.size()) return -1;
    int v = 0;
    for (size_t i = pos; i < pos + n; ++i) {
      if (text[i] < '0' || text[i] > '9') return -1;
      v = v * 10 + (text[i] - '0');
    }
    return v;
  };
  std::tm tm{};
  tm.tm_year = digits(0, 4) - 1900;
  tm.tm_mon = digits(5, 2) - 1;
  tm.tm_mday = digits(8, 2);
  tm.tm_hour = digits(11, 2);
  tm.tm_min = digits(14, 2);
  tm.tm_sec = digits(17, 2);
  size_t end = 19;
  if (end < text.size() && text[end] == '.') {
    ++end;
    const size_t first = end;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end == first || end - first > 9) return std::nullopt;  // a '.' needs 1 to 9 digits
  }
  const bool shaped = text.size() >= 20 && text[4] == '-' && text[7] == '-' && text[10] == 'T' &&
                      text[13] == ':' && text[16] == ':' && end + 1 == text.size() &&
                      text[end] == 'Z';
  const bool ranged = tm.tm_year >= 70 && tm.tm_mon >= 0 && tm.tm_mon < 12 && tm.tm_mday >= 1 &&
                      tm.tm_mday <= 31 && tm.tm_hour >= 0 && tm.tm_hour < 24 && tm.tm_min >= 0 &&
                      tm.tm_min < 60 && tm.tm_sec >= 0 && tm.tm_sec <= 60;
  if (!shaped || !ranged) return std::nullopt;
  return static_cast<int64_t>(::timegm(&tm));
}

bool newer(const SnapshotAge& a, const SnapshotAge& b) {
  if (a.step != b.step) return !b.step || (a.step && *a.step > *b.step);
  return a.created_unix_ns > b.created_unix_ns;
}

uint64_t chunk_offset(const FileRecord& f, uint64_t c) { return c * f.chunk_bytes; }

uint64_t chunk_length(const FileRecord& f, uint64_t c) {
  return std::min(f.chunk_bytes, f.size - std::min(f.size, c * f.chunk_bytes));
}

SnapshotAge age_of(const Manifest& m) { return {step_of(m.metadata), m.created_unix_ns}; }

std::vector<std::string> objects_of(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (const std::string& key : keys) {
    const size_t slash = key.find('/');
    if (slash != std::string::npos) out.push_back(key.substr(0, slash));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void check_object(const std::vector<std::string>& keys, const std::string& object,
                  const std::string& snapshot) {
  const std::vector<std::string> objects = objects_of(keys);
  if (std::binary_search(objects.begin(), objects.end(), object)) return;
  std::string list;
  for (const std::string& o : objects) list += (list.empty() ? "" : ", ") + o;
  throw_error(
      ErrorCode::kKeyNotFound,
      "snapshot " + snapshot + " has no object '" + object + "' (no key starts with '" + object +
          "/'); " +
          (objects.empty() ? "it has no keys of the form OBJECT/KEY" : "its objects: " + list));
}

}  // namespace tsnap::format
