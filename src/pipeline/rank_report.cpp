#include "pipeline/rank_report.h"

#include <algorithm>
#include <map>
#include <utility>

#include "dist/coordinator.h"
#include "format/manifest_io.h"
#include "tsnap/error.h"

namespace tsnap::pipeline {
namespace {

using nlohmann::json;

[[noreturn]] void disagree(const std::string& what) {
  throw_error(ErrorCode::kPeerFailed, "the ranks of a distributed save disagree: " + what);
}

// A replicated entry "<key> <dtype> <shape>" split into its key and the rest.
std::pair<std::string, std::string> split_entry(const std::string& entry) {
  const size_t shape = entry.rfind(" [");
  const size_t dtype =
      shape == std::string::npos || shape == 0 ? std::string::npos : entry.rfind(' ', shape - 1);
  if (dtype == std::string::npos) return {entry, ""};
  return {entry.substr(0, dtype), entry.substr(dtype + 1)};
}

// The first difference between two ranks' sorted lists of replicated entries, as a message,
// or "": a key stored with another dtype or shape, else a key that only one rank has.
std::string first_difference(const std::vector<std::string>& a, int ra,
                             const std::vector<std::string>& b, int rb) {
  std::map<std::string, std::string> of_a, of_b;
  for (const std::string& e : a) of_a.insert(split_entry(e));
  for (const std::string& e : b) of_b.insert(split_entry(e));
  for (const auto& [key, what] : of_a) {
    const auto it = of_b.find(key);
    if (it != of_b.end() && it->second != what) {
      return "replicated tensor '" + key + "' is " + what + " on rank " + std::to_string(ra) +
             " but " + it->second + " on rank " + std::to_string(rb);
    }
  }
  const auto say = [](const std::string& entry, int in, int not_in) {
    return "replicated tensor '" + entry + "' is on rank " + std::to_string(in) +
           " but not on rank " + std::to_string(not_in);
  };
  for (const auto& [key, what] : of_a) {
    if (!of_b.count(key)) return say(key + " " + what, ra, rb);
  }
  for (const auto& [key, what] : of_b) {
    if (!of_a.count(key)) return say(key + " " + what, rb, ra);
  }
  return "";
}

}  // namespace

json error_json(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return {{"code", static_cast<int>(err.code())},
            {"message", err.what()},
            {"errno", err.sys_errno()}};
  } catch (const std::exception& err) {
    return {{"code", static_cast<int>(ErrorCode::kInternal)}, {"message", err.what()}};
  } catch (...) {
    return {{"code", static_cast<int>(ErrorCode::kInternal)}, {"message", "unknown exception"}};
  }
}

std::exception_ptr error_from_json(const json& j) {
  const int code = j.value("code", static_cast<int>(ErrorCode::kInternal));
  const bool known = code >= 0 && code <= static_cast<int>(ErrorCode::kStale);
  return make_error(known ? static_cast<ErrorCode>(code) : ErrorCode::kInternal,
                    j.value("message", std::string("(no message)")), j.value("errno", 0));
}

json peer_failed(const json& error, int rank) {
  json e = error;
  const int code = e.value("code", static_cast<int>(ErrorCode::kInternal));
  const bool known = code >= 0 && code <= static_cast<int>(ErrorCode::kStale);
  e["message"] = "rank " + std::to_string(rank) + " failed (" +
                 to_string(known ? static_cast<ErrorCode>(code) : ErrorCode::kInternal) +
                 "): " + e.value("message", std::string());
  e["code"] = static_cast<int>(ErrorCode::kPeerFailed);
  return e;
}

void report_no_part(dist::Coordinator& coordinator, const std::string& id, const std::string& name,
                    std::exception_ptr error) noexcept {
  try {
    json e = error_json(error);
    if (coordinator.rank() == 0) {
      coordinator.decide(id, peer_failed(e, 0).dump());
    } else {
      coordinator.publish(id, json{{"name", name}, {"error", e}}.dump());
      coordinator.acknowledge(id);
    }
  } catch (...) {
    // The store is gone: the others fail on their timeout.
  }
}

std::string merge_parts(const std::vector<std::string>& reports, const json& metadata) {
  std::vector<json> parsed;
  parsed.reserve(reports.size());
  for (size_t r = 0; r < reports.size(); ++r) {
    try {
      parsed.push_back(json::parse(reports[r]));
    } catch (const json::exception& e) {
      throw_error(ErrorCode::kInternal,
                  "rank " + std::to_string(r) + "'s report is not JSON: " + e.what());
    }
  }
  for (size_t r = 0; r < parsed.size(); ++r) {
    if (const auto it = parsed[r].find("error"); it != parsed[r].end()) {
      std::rethrow_exception(error_from_json(peer_failed(*it, static_cast<int>(r))));
    }
  }
  const std::string name = parsed[0].value("name", "");
  const auto replicated0 = parsed[0].value("replicated", std::vector<std::string>{});
  for (size_t r = 1; r < parsed.size(); ++r) {
    const std::string other = parsed[r].value("name", "");
    if (other != name) {
      disagree("rank 0 saves '" + name + "', rank " + std::to_string(r) + " saves '" + other + "'");
    }
    const std::string diff =
        first_difference(replicated0, 0, parsed[r].value("replicated", std::vector<std::string>{}),
                         static_cast<int>(r));
    if (!diff.empty()) disagree(diff);
  }

  Manifest merged;
  // A key is unchanged when every rank that holds a piece of it found that piece unchanged.
  std::map<std::string, std::pair<size_t, size_t>> unchanged;  // key: (holders, unchanged)
  bool compared = true;
  for (size_t r = 0; r < parsed.size(); ++r) {
    const std::string label = "rank " + std::to_string(r) + "'s manifest part";
    Manifest part = format::parse_manifest(parsed[r].value("manifest", ""), label);
    compared = compared && !part.unchanged_since.empty();
    std::string last;
    for (const TensorRecord& t : part.tensors) {
      if (t.name != last) ++unchanged[t.name].first;
      last = t.name;
    }
    for (const std::string& k : part.unchanged) ++unchanged[k].second;
    if (r == 0) {
      merged = std::move(part);
      continue;
    }
    for (FileRecord& f : part.files) merged.files.push_back(std::move(f));
    for (TensorRecord& t : part.tensors) merged.tensors.push_back(std::move(t));
  }
  merged.metadata = metadata;
  merged.unchanged.clear();
  if (!compared) merged.unchanged_since.clear();
  for (const auto& [key, counts] : unchanged) {
    if (compared && counts.first == counts.second) merged.unchanged.push_back(key);
  }
  std::string text;
  try {
    text = format::manifest_to_text(merged);
    format::check_manifest_readable(text);
    (void)format::parse_manifest(text, "the merged manifest");
  } catch (const Error& e) {
    disagree(std::string("their tensors do not fit together: ") + e.what());
  }
  return text;
}

}  // namespace tsnap::pipeline
