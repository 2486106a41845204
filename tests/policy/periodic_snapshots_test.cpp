// PeriodicSnapshots: due-ness by steps and time, the skip and wait policies, lazy staging,
// resume of the newest valid snapshot, retention through the hook, stats and log lines.

#include "tsnap/periodic_snapshots.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "format/layout.h"
#include "pipeline/commit.h"
#include "pipeline/root_lock.h"
#include "policy/retention.h"
#include "policy_test_util.h"
#include "support/on_engine.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::TempDir;

std::vector<std::string> snapshot_names(const fs::path& root) {
  std::vector<std::string> out;
  for (const std::string& e : test_support::dir_entries(root)) {
    if (e[0] != '.') out.push_back(e);
  }
  return out;
}

StateDict state_at(const fs::path& snapshot) {
  return load_checkpoint(snapshot).object_state("state");
}

TEST(PeriodicSnapshots, SavesEveryNStepsWithStepMetadata) {
  TempDir dir;
  Snapshotter snap(test_support::small_options(dir.path()));
  StateDict sd = test_support::small_state(1);
  test_support::LogLines log;
  std::vector<nlohmann::json> records;  // on_snapshot calls never overlap
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 3}),
                         [&] { return test_support::checkpoint_of(sd); },
                         {.when_busy = WhenBusy::kWait,
                          .log = log.sink(),
                          .on_snapshot = [&](const SnapshotRecord& r) { records.push_back(r); }});
  for (int64_t step = 1; step <= 10; ++step) {
    sd.at("w").fill_(static_cast<float>(step));
    hook.after_step(step);
  }
  const PeriodicStats stats = hook.finish();
  EXPECT_EQ(snapshot_names(dir.path()),
            (std::vector<std::string>{"step-00000003", "step-00000006", "step-00000009"}));
  for (int64_t step : {3, 6, 9}) {
    const fs::path path = dir / format::step_name(step);
    EXPECT_EQ(read_manifest(path).metadata["step"], step);
    EXPECT_TRUE(bitwise_equal(state_at(path).at("w"), at::full({64, 32}, float(step))));
  }
  ASSERT_EQ(stats.snapshots.size(), 3u);
  for (const SnapshotRecord& r : stats.snapshots) {
    EXPECT_TRUE(r.committed);
    EXPECT_EQ(r.reason, SnapshotReason::kSteps);
    EXPECT_GT(r.save.bytes, 0u);
    EXPECT_GT(r.save.total_s, 0);
    EXPECT_GE(r.blocked_s, r.save.stall_s);
  }
  EXPECT_EQ(stats.skipped, 0);
  EXPECT_EQ(stats.bytes(), stats.snapshots[0].save.bytes + stats.snapshots[1].save.bytes +
                               stats.snapshots[2].save.bytes);
  EXPECT_EQ(log.count("committed (steps)"), 3);
  EXPECT_EQ(log.count("tsnap: 3 snapshots (3 committed, 0 failed), 0 skipped"), 1);
  ASSERT_EQ(records.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const SnapshotRecord& r = stats.snapshots[i];
    EXPECT_EQ(records[i]["step"], r.step);
    EXPECT_EQ(records[i]["name"], r.name);
    EXPECT_EQ(records[i]["reason"], "steps");
    EXPECT_EQ(records[i]["committed"], true);
    EXPECT_EQ(records[i]["save"]["bytes"], r.save.bytes);
    EXPECT_EQ(records[i]["save"]["buffer_waits"], r.save.buffer_waits);
    EXPECT_DOUBLE_EQ(records[i]["save"]["total_s"].get<double>(), r.save.total_s);
    EXPECT_EQ(records[i]["save"]["engine"], r.save.engine);
  }
}

// The hook records each snapshot's step and checks the optimizer's moments by default: moments
// saved from a copy that stopped updating are reported in the snapshot's log line.
TEST(PeriodicSnapshots, WarnsWhenTheOptimizerMomentsStopChanging) {
  TempDir dir;
  Snapshotter snap(test_support::small_options(dir.path()));
  StateDict sd = test_support::small_state(1);
  at::Tensor moment = at::zeros({64, 32});
  sd.insert("optim/w/exp_avg", moment);
  test_support::LogLines log;
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 2}),
                         [&] { return test_support::checkpoint_of(sd); },
                         {.when_busy = WhenBusy::kWait, .log = log.sink()});
  for (int64_t step = 1; step <= 6; ++step) {
    sd.at("w").fill_(static_cast<float>(step));
    if (step <= 4) moment.fill_(static_cast<float>(step));  // then it stops updating
    hook.after_step(step);
  }
  const PeriodicStats stats = hook.finish();
  ASSERT_EQ(stats.snapshots.size(), 3u);
  EXPECT_TRUE(stats.snapshots[1].save.stale.empty());
  EXPECT_EQ(stats.snapshots[2].save.stale, std::vector<std::string>{"state/optim/w/exp_avg"});
  EXPECT_EQ(stats.snapshots[2].save.unchanged_since, "step-00000004");
  EXPECT_EQ(log.count("WARNING: 1 tensors that training changes at every step did not change"), 1);
  EXPECT_EQ(log.count("unchanged since step-00000002"), 1);
  EXPECT_EQ(read_manifest(dir / "step-00000006").step, 6);
}

TEST(PeriodicSnapshots, SavesByTimeAtAStepBoundary) {
  TempDir dir;
  Snapshotter snap(test_support::small_options(dir.path()));
  const StateDict sd = test_support::small_state(2);
  const auto started = std::chrono::steady_clock::now();
  PeriodicSnapshots hook(snap, Schedule({.every_seconds = 1.0}),
                         [&] { return test_support::checkpoint_of(sd); }, {.log = nullptr});
  std::vector<double> at_step{0};  // seconds since the start at each after_step
  // Steps go on until the timer's flag turns a boundary into a snapshot.
  while (hook.stats().snapshots.empty() && at_step.size() < 1000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    at_step.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    hook.after_step(static_cast<int64_t>(at_step.size() - 1));
    snap.wait_all();
  }
  hook.after_step(static_cast<int64_t>(at_step.size()));  // the timer restarted: not due yet
  const PeriodicStats stats = hook.finish();
  ASSERT_EQ(stats.snapshots.size(), 1u);
  const SnapshotRecord& r = stats.snapshots[0];
  EXPECT_EQ(r.reason, SnapshotReason::kTime);
  EXPECT_GE(at_step.at(static_cast<size_t>(r.step)), 1.0);
  EXPECT_EQ(snapshot_names(dir.path()), std::vector<std::string>{r.name});
}

TEST(PeriodicSnapshots, SkipsWhileThePreviousIsWriting) {
  TempDir dir;
  auto gate = std::make_shared<test_support::GateEngine>();
  Snapshotter snap = test_support::on_engine(
      gate, [&] { return Snapshotter(test_support::small_options(dir.path())); });
  const StateDict sd = test_support::small_state(3);
  test_support::LogLines log;
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 1}),
                         [&] { return test_support::checkpoint_of(sd); }, {.log = log.sink()});
  hook.after_step(1);  // its commit waits at the gate
  hook.after_step(2);  // returns at once: skipped
  hook.after_step(3);
  EXPECT_EQ(hook.stats().skipped, 2);
  EXPECT_TRUE(hook.stats().snapshots.empty());
  gate->open_gate();
  const PeriodicStats stats = hook.finish();
  EXPECT_EQ(stats.skipped, 2);
  EXPECT_EQ(snapshot_names(dir.path()), std::vector<std::string>{"step-00000001"});
  EXPECT_EQ(log.count("step-00000002 skipped (steps): step-00000001 is still writing"), 1);
  hook.after_step(4);  // the previous one is done: saved again
  hook.finish();
  EXPECT_EQ(snapshot_names(dir.path()),
            (std::vector<std::string>{"step-00000001", "step-00000004"}));
}

TEST(PeriodicSnapshots, WaitPolicyWaitsForThePreviousCommit) {
  TempDir dir;
  auto gate = std::make_shared<test_support::GateEngine>();
  Snapshotter snap = test_support::on_engine(
      gate, [&] { return Snapshotter(test_support::small_options(dir.path())); });
  StateDict sd = test_support::small_state(4);
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 1}),
                         [&] { return test_support::checkpoint_of(sd); },
                         {.when_busy = WhenBusy::kWait, .log = nullptr});
  hook.after_step(1);
  std::atomic<bool> opened{false};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    opened = true;
    gate->open_gate();
  });
  sd.at("w").fill_(2);
  hook.after_step(2);  // blocks until step 1 committed
  EXPECT_TRUE(opened);
  opener.join();
  const PeriodicStats stats = hook.finish();
  EXPECT_EQ(stats.skipped, 0);
  ASSERT_EQ(stats.snapshots.size(), 2u);
  EXPECT_GE(stats.snapshots[1].blocked_s, stats.snapshots[1].save.stall_s);
  EXPECT_TRUE(bitwise_equal(state_at(dir / "step-00000002").at("w"), at::full({64, 32}, 2.f)));
}

TEST(PeriodicSnapshots, LazyStagingIsExactAfterBeforeOptimizerStep) {
  TempDir dir;
  Snapshotter snap(test_support::small_options(dir.path()));
  StateDict sd;
  sd.insert("w", test_support::make_tensor(at::kFloat, {1 << 20}, 5));  // 4 MiB: several chunks
  const at::Tensor before = sd.at("w").clone();
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 1}),
                         [&] { return test_support::checkpoint_of(sd); },
                         {.save = {.staging = Staging::kLazy}, .log = nullptr});
  hook.after_step(1);
  hook.before_optimizer_step();
  sd.at("w").fill_(-1);  // the "optimizer step"
  hook.finish();
  EXPECT_TRUE(bitwise_equal(state_at(dir / "step-00000001").at("w"), before));
}

TEST(PeriodicSnapshots, ResumeReturnsZeroWhenThereIsNothing) {
  TempDir dir;
  Snapshotter snap(test_support::small_options(dir.path()));
  const StateDict sd = test_support::small_state(6);
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 1}),
                         [&] { return test_support::checkpoint_of(sd); }, {.log = nullptr});
  bool applied = false;
  EXPECT_EQ(hook.resume([&](Checkpoint&) { applied = true; }), 0);
  EXPECT_FALSE(applied);
}

// The first after_step prepares the Snapshotter's staging pool for the hook's checkpoint
// (automatic budget), so that the first snapshot stalls like the later ones.
TEST(PeriodicSnapshots, TheFirstStepPreparesTheStagingPool) {
  TempDir dir;
  SnapshotterOptions o = test_support::small_options(dir.path());
  o.staging.budget_bytes = 0;
  Snapshotter snap(o);
  const StateDict sd = test_support::small_state(6);
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 2}),
                         [&] { return test_support::checkpoint_of(sd); }, {.log = nullptr});
  EXPECT_EQ(hook.resume([&](Checkpoint&) {}), 0);
  EXPECT_EQ(snap.staging_budget_bytes(), 0u);
  hook.after_step(1);  // not due: prepares
  const uint64_t budget = snap.staging_budget_bytes();
  EXPECT_GT(budget, 0u);
  hook.after_step(2);
  const PeriodicStats stats = hook.finish();
  EXPECT_EQ(stats.snapshots.size(), 1u);
  EXPECT_EQ(snap.staging_budget_bytes(), budget);
}

// The newest directories are a temporary, one without a manifest, and one whose shard fails
// its hash: resume takes the newest valid one, and the run then overwrites the bad ones.
TEST(PeriodicSnapshots, ResumeSkipsCorruptAndTemporarySnapshots) {
  TempDir dir;
  for (int64_t step : {10, 20, 30}) {
    test_support::save_step(dir.path(), format::step_name(step), step,
                            test_support::small_state(step));
  }
  const fs::path bad_hash = dir / format::step_name(30);
  for (const auto& e : fs::directory_iterator(bad_hash)) {
    if (e.path().extension() == ".safetensors") test_support::flip_byte(e.path(), 4096 + 17);
  }
  fs::create_directory(dir / format::step_name(40));  // no manifest
  std::ofstream(dir / format::step_name(40) / "MANIFEST.json") << "{ truncated";
  Snapshotter snap(test_support::small_options(dir.path()));
  // A temporary that holds a complete copy of a newer snapshot: still never read. (Made after the
  // Snapshotter started, so it belongs to a live writer and is not removed.)
  const fs::path temporary =
      dir / format::temporary_name(format::step_name(50), format::new_save_id());
  fs::copy(dir / format::step_name(20), temporary);

  StateDict sd = test_support::small_state(999);
  test_support::LogLines log;
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 10}),
                         [&] { return test_support::checkpoint_of(sd); },
                         {.when_busy = WhenBusy::kWait, .log = log.sink()});
  const int64_t step = hook.resume([&](Checkpoint& c) { c.apply({{"state", sd}}); });
  EXPECT_EQ(step, 20);
  EXPECT_TRUE(bitwise_equal(sd.at("w"), test_support::small_state(20).at("w")));
  EXPECT_EQ(log.count("resumed from step-00000020 (step 20)"), 1);
  EXPECT_EQ(log.count("resume skips step-00000030"), 1);
  EXPECT_EQ(log.count("resume skips step-00000040"), 1);

  hook.after_step(20);  // the step resumed from: not saved again
  for (int64_t s = 21; s <= 40; ++s) hook.after_step(s);
  hook.finish();
  EXPECT_NO_THROW(load(dir / format::step_name(30)));
  EXPECT_NO_THROW(load(dir / format::step_name(40)));
  EXPECT_EQ(log.count("replacing step-00000040, which does not read"), 1);
  EXPECT_EQ(latest(dir.path()), dir / format::step_name(40));
}

TEST(PeriodicSnapshots, RetentionThroughTheHook) {
  TempDir dir;
  Snapshotter snap(test_support::small_options(dir.path()));
  const StateDict sd = test_support::small_state(8);
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 1, .keep_last = 2, .keep_every_steps = 4}),
                         [&] { return test_support::checkpoint_of(sd); },
                         {.when_busy = WhenBusy::kWait, .log = nullptr});
  for (int64_t step = 1; step <= 10; ++step) hook.after_step(step);
  const PeriodicStats stats = hook.finish();
  EXPECT_EQ(snapshot_names(dir.path()),
            (std::vector<std::string>{"step-00000004", "step-00000008", "step-00000009",
                                      "step-00000010"}));
  EXPECT_EQ(stats.deleted, 6);
  ASSERT_EQ(stats.snapshots.size(), 10u);
  EXPECT_EQ(stats.snapshots[8].deleted, std::vector<std::string>{"step-00000007"});  // at step 9
  EXPECT_TRUE(stats.snapshots[9].deleted.empty());
}

// keep_best through the hook: the metric comes from each snapshot's metadata.
TEST(PeriodicSnapshots, KeepsTheBestByAMetadataMetric) {
  TempDir dir;
  Snapshotter snap(test_support::small_options(dir.path()));
  const StateDict sd = test_support::small_state(8);
  const double loss[] = {0, 0.9, 0.3, 0.8, 0.2, 0.7, 0.6, 0.5};  // by step (1..7)
  int64_t step = 0;
  PeriodicSnapshots hook(snap,
                         Schedule({.every_steps = 1, .keep_best = 2, .best_metric = "val_loss"}),
                         [&] {
                           return Checkpoint::of({{"state", sd}}, {{"val_loss", loss[step]}});
                         },
                         {.when_busy = WhenBusy::kWait, .log = nullptr});
  for (step = 1; step <= 7; ++step) hook.after_step(step);
  hook.finish();
  // Best two (steps 4 and 2), and the newest (7).
  EXPECT_EQ(snapshot_names(dir.path()),
            (std::vector<std::string>{"step-00000002", "step-00000004", "step-00000007"}));
}

// Continuous saving takes the next snapshot once the previous one is done, never skipping one.
TEST(PeriodicSnapshots, ContinuousSavesWhenThePreviousIsDone) {
  TempDir dir;
  Snapshotter snap(test_support::small_options(dir.path()));
  const StateDict sd = test_support::small_state(8);
  PeriodicSnapshots hook(snap, Schedule({.continuous = true}),
                         [&] { return test_support::checkpoint_of(sd); }, {.log = nullptr});
  for (int64_t step = 1; step <= 40; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    hook.after_step(step);
  }
  const PeriodicStats stats = hook.finish();
  EXPECT_EQ(stats.skipped, 0);
  ASSERT_GE(stats.snapshots.size(), 3u);
  EXPECT_EQ(stats.snapshots[0].step, 1);  // min_interval 0: due at once
  EXPECT_EQ(stats.snapshots[0].reason, SnapshotReason::kContinuous);
  for (const SnapshotRecord& r : stats.snapshots) {
    EXPECT_TRUE(r.committed);
    EXPECT_EQ(r.reason, SnapshotReason::kContinuous);
  }
}

TEST(PeriodicSnapshots, RejectsNullCheckpointFunction) {
  TempDir dir;
  Snapshotter snap(test_support::small_options(dir.path()));
  EXPECT_THROW(PeriodicSnapshots(snap, Schedule({.every_steps = 1}), nullptr), InvalidArgument);
}

}  // namespace
}  // namespace tsnap
