#pragma once
// Helpers of the policy tests: a small checkpoint, an engine whose commits wait for a gate, a
// log that records lines.

#include <ATen/ATen.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/engine.h"
#include "support/gate_engine.h"
#include "support/test_util.h"
#include "tsnap/checkpoint.h"
#include "tsnap/periodic_snapshots.h"
#include "tsnap/snapshotter.h"

namespace tsnap::test_support {

/// Two float tensors with deterministic values.
inline StateDict small_state(uint64_t seed) {
  StateDict sd;
  sd.insert("w", make_tensor(at::kFloat, {64, 32}, seed));
  sd.insert("b", make_tensor(at::kFloat, {32}, seed + 1));
  return sd;
}

/// A checkpoint holding `state` as the object "state".
inline Checkpoint checkpoint_of(const StateDict& state) {
  return Checkpoint::of({{"state", state}});
}

/// Saves `state` as the periodic snapshot of `step` under `root`, as a hook would.
inline void save_step(const std::filesystem::path& root, const std::string& name, int64_t step,
                      const StateDict& state) {
  Checkpoint c = checkpoint_of(state);
  c.metadata()["step"] = step;
  save(root / name, c);
}

/// Snapshotter options for small test snapshots under `root`.
inline SnapshotterOptions small_options(const std::filesystem::path& root) {
  SnapshotterOptions o;
  o.root = root;
  o.staging.budget_bytes = 4 << 20;
  o.chunk_bytes = 1 << 20;
  return o;
}

/// Records log lines (thread-safe).
class LogLines {
 public:
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(line);
    };
  }
  std::vector<std::string> lines() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  /// How many lines contain `text`.
  int count(const std::string& text) const {
    int n = 0;
    for (const std::string& l : lines()) n += l.find(text) != std::string::npos ? 1 : 0;
    return n;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

}  // namespace tsnap::test_support
