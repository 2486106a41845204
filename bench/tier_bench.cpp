// The durable tier's benchmark: saving one state (a) directly to a slow
// directory and (b) to a fast local directory with the drain to the slow one
// (SnapshotterOptions::tier.durable_root). For each, per repetition:
//   stall    how long save_async blocked the caller;
//   commit   call -> the snapshot is committed where the Snapshotter writes (slow root for (a),
//            local root for (b)): when the handle completes, and when the next save may start
//            without waiting under max_in_flight = 1;
//   durable  call -> committed in the slow directory ((a): the same as commit; (b): drain_wait).
// One Snapshotter per mode, a warm-up save first (the staging pool is allocated at the first
// save), then `--reps` measured saves, each removed from both roots afterwards. Medians and
// min..max. The slow directory is whatever the caller mounts there; bench/slow_target.sh makes
// a write-throttled loop device (docs/benchmarks.md).
//
//   tsnap_bench_tier --local DIR --slow DIR [--mib 1024] [--reps 3] [--budget-mib 0]

#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tsnap/remove.h"
#include "tsnap/snapshotter.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Figures {
  std::vector<double> stall, commit, durable;
};

void print(const char* what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::printf("  %-8s median %7.3f s   (min %.3f, max %.3f, n=%zu)\n", what, v[v.size() / 2],
              v.front(), v.back(), v.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The durable tier against saving to a slow directory directly"};
  fs::path local, slow;
  int mib = 1024, reps = 3;
  uint64_t budget_mib = 0;
  app.option_defaults()->always_capture_default();
  app.add_option("--local", local, "Fast local directory: the tier's root")->required();
  app.add_option("--slow", slow, "Slow directory: the direct saves and the durable root")
      ->required();
  app.add_option("--mib", mib, "State size in MiB (fp32 tensors of 64 MiB)")
      ->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "Measured saves per mode, after a warm-up save")
      ->check(CLI::Range(1, 1000));
  app.add_option("--budget-mib", budget_mib, "Staging budget in MiB (0: automatic)");
  CLI11_PARSE(app, argc, argv);
  tsnap::StateDict state;
  const int tensors = std::max(1, mib / 64);
  for (int i = 0; i < tensors; ++i) {
    state.insert("layer" + std::to_string(i), at::randn({64 << 18}));  // 64 MiB of fp32
  }
  std::printf("state: %d tensors, %.3f GB fp32; local %s, slow %s, staging budget %s\n", tensors,
              tensors * 64.0 * (1 << 20) / 1e9, local.c_str(), slow.c_str(),
              budget_mib ? (std::to_string(budget_mib) + " MiB").c_str() : "automatic");

  for (const bool tier : {false, true}) {
    const fs::path root = tier ? local / "tier-local" : slow / "direct";
    const fs::path durable = slow / "tier-durable";
    tsnap::SnapshotterOptions o;
    o.root = root;
    o.staging.budget_bytes = budget_mib << 20;
    o.max_in_flight = 1;
    if (tier) {
      o.tier.durable_root = durable;
      o.tier.local_keep_last = 0;
    }
    tsnap::Snapshotter snap(o);
    Figures f;
    for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up
      const std::string name = "rep-" + std::to_string(rep + 1);
      const auto t0 = Clock::now();
      tsnap::SaveHandle h = snap.save_async(name, state);
      const double stall = since(t0);
      h.wait();
      const double commit = since(t0);
      snap.drain_wait();
      const double done = since(t0);
      if (rep >= 0) {
        f.stall.push_back(stall);
        f.commit.push_back(commit);
        f.durable.push_back(done);
      }
      tsnap::remove_snapshot(root / name);
      if (tier) tsnap::remove_snapshot(durable / name);
    }
    std::printf("%s (engine %s):\n",
                tier ? "(b) local tier + drain to the slow directory"
                     : "(a) directly to the slow directory",
                snap.engine_name().c_str());
    print("stall", f.stall);
    print("commit", f.commit);
    print("durable", f.durable);
    std::fflush(stdout);
  }
  return 0;
}
