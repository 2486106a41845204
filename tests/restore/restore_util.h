#pragma once
// Helpers of the restore tests: snapshots with a known chunk layout, page-cache eviction (so
// the O_DIRECT path is taken), deep copies of states, and error expectations.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "support/test_util.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"
#include "tsnap/state_dict.h"

namespace tsnap::test_support {

/// Drops the snapshot's shard files from the page cache (clean pages), so that a load with
/// direct I/O allowed reads them with O_DIRECT.
inline void evict(const std::filesystem::path& snapshot) {
  for (const auto& e : std::filesystem::directory_iterator(snapshot)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

/// Whether files under `dir` can be opened with O_DIRECT.
inline bool direct_io_works(const std::filesystem::path& dir) {
  const std::string path = (dir / ".direct-probe").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
  if (fd >= 0) ::close(fd);
  ::unlink(path.c_str());
  return fd >= 0;
}

/// A deep copy of every tensor (so a state can be compared after an in-place load).
inline StateDict clone(const StateDict& sd) {
  StateDict out;
  for (const auto& [k, e] : sd) out.insert(k, e.tensor.clone());
  return out;
}

/// `sd` with every tensor filled with `value` (same dtypes and shapes, new storage).
inline StateDict filled_like(const StateDict& sd, double value) {
  StateDict out;
  for (const auto& [k, e] : sd) out.insert(k, at::full_like(e.tensor, value));
  return out;
}

/// True when both states have the same keys and bitwise equal tensors.
inline bool same_state(const StateDict& a, const StateDict& b) {
  if (a.keys() != b.keys()) return false;
  for (const auto& [k, e] : a) {
    if (!bitwise_equal(e.tensor, b.at(k))) return false;
  }
  return true;
}

/// Rewrites the manifest's format_version (a snapshot "from the future").
inline void set_format_version(const std::filesystem::path& snapshot, int version) {
  const auto path = snapshot / kManifestName;
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  j["format_version"] = version;
  std::ofstream(path) << test_support::signed_manifest_text(j);
}

/// Runs `f`, expects a tsnap::Error of `code`, and returns its message.
inline std::string error_of(const std::function<void()>& f, ErrorCode code) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(to_string(e.code()), std::string(to_string(code))) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an error " << to_string(code);
  return {};
}

/// Whether `text` contains `part`.
inline bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace tsnap::test_support
