// Retention: which snapshots are deleted, and a crash at every point of the deletion sequence
// leaves the newest snapshot complete, no half-deleted snapshot, and only temporaries that the
// next writer removes.

#include "policy/retention.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "format/layout.h"
#include "pipeline/root_lock.h"
#include "policy_test_util.h"
#include "support/on_engine.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using policy::RetentionPoint;
using test_support::TempDir;

struct SimulatedCrash {};

std::vector<std::string> snapshot_names(const fs::path& root) {
  std::vector<std::string> out;
  for (const std::string& e : test_support::dir_entries(root)) {
    if (e[0] != '.') out.push_back(e);
  }
  return out;
}

TEST(Retention, DeletesExpiredPeriodicSnapshotsOnly) {
  TempDir dir;
  for (int64_t step : {1, 2, 3, 4, 5, 6, 9}) {
    test_support::save_step(dir.path(), format::step_name(step), step,
                            test_support::small_state(1));
  }
  test_support::save_step(dir.path(), "manual", 2,
                          test_support::small_state(1));  // not a periodic name
  fs::create_directory(dir / "step-00000000");            // not committed
  const Schedule s({.keep_last = 2, .keep_every_steps = 3});
  // Step 9 is newer than the snapshot just committed (6): an abandoned run's, left alone.
  const std::vector<std::string> deleted = policy::apply_retention(dir.path(), s, 6);
  EXPECT_EQ(deleted, (std::vector<std::string>{"step-00000001", "step-00000002", "step-00000004"}));
  EXPECT_EQ(snapshot_names(dir.path()),
            (std::vector<std::string>{"manual", "step-00000000", "step-00000003", "step-00000005",
                                      "step-00000006", "step-00000009"}));
  for (const std::string& e : test_support::dir_entries(dir.path())) EXPECT_NE(e[0], '.') << e;
}

// Every point of the sequence (3 victims x 3 points), with the crash simulated by a probe that
// throws; at kRenamed the victim's manifest is removed first, as a crash in the middle of the
// recursive removal would leave it.
TEST(Retention, CrashAtEveryPointLeavesTheNewestSnapshotComplete) {
  const int kVictims = 3;
  const int kPoints = 3 * kVictims;
  const StateDict newest = test_support::small_state(40);
  for (int crash_at = 1; crash_at <= kPoints; ++crash_at) {
    SCOPED_TRACE("crash at probe call " + std::to_string(crash_at));
    TempDir dir;
    for (int64_t step = 1; step <= 3; ++step) {
      test_support::save_step(dir.path(), format::step_name(step), step,
                              test_support::small_state(10 * step));
    }
    test_support::save_step(dir.path(), format::step_name(4), 4, newest);
    int calls = 0;
    const auto probe = [&](RetentionPoint point, const fs::path& path) {
      if (++calls < crash_at) return;
      if (point == RetentionPoint::kRenamed) fs::remove(path / kManifestName);
      throw SimulatedCrash{};
    };
    EXPECT_THROW(policy::apply_retention(dir.path(), Schedule({.keep_last = 1}), 4, probe),
                 SimulatedCrash);

    // What a reader sees after the crash: every directory that is not a temporary is a complete
    // snapshot, and the newest is the one just committed.
    int complete = 0;
    for (const Listed& l : list(dir.path())) {
      if (l.temporary) continue;
      ASSERT_TRUE(l.committed) << l.name << ": " << l.problem;
      EXPECT_NO_THROW(load(l.path)) << l.name;
      ++complete;
    }
    EXPECT_GE(complete, 1);
    ASSERT_EQ(latest(dir.path()), dir / "step-00000004");
    const StateDict loaded = load_checkpoint(dir / "step-00000004").object_state("state");
    EXPECT_TRUE(test_support::bitwise_equal(loaded.at("w"), newest.at("w")));

    // The next writer removes the leftover temporary; retention then finishes the job.
    { pipeline::RootLock next(dir.path()); }
    for (const std::string& e : test_support::dir_entries(dir.path())) EXPECT_NE(e[0], '.') << e;
    policy::apply_retention(dir.path(), Schedule({.keep_last = 1}), 4);
    EXPECT_EQ(snapshot_names(dir.path()), std::vector<std::string>{"step-00000004"});
  }
}

// Incremental snapshots share files through hard links: a crash at every point of retention
// (the probe also removes a shard of the victim being deleted, as a crash midway through its
// recursive removal would) must leave every snapshot that is not a temporary loading bitwise.
TEST(Retention, CrashAtEveryPointOfAnIncrementalChainLeavesTheRestWhole) {
  const int kSteps = 5;
  const int kVictims = kSteps - 2;  // keep_last = 2
  for (int crash_at = 1; crash_at <= 3 * kVictims; ++crash_at) {
    SCOPED_TRACE("crash at probe call " + std::to_string(crash_at));
    TempDir dir;
    {
      SnapshotterOptions o = test_support::small_options(dir.path());
      o.chunk_bytes = 64 << 10;
      o.incremental = true;
      Snapshotter snap(o);
      for (int step = 1; step <= kSteps; ++step) {
        SaveHandle h = snap.save_async(format::step_name(step),
                                       test_support::fine_tuning_state(step), {{"step", step}});
        h.wait();
        if (step > 1) ASSERT_GT(h.stats().linked_bytes, 0u);
      }
    }
    int calls = 0;
    const auto probe = [&](RetentionPoint point, const fs::path& path) {
      if (++calls < crash_at) return;
      if (point == RetentionPoint::kRenamed) {
        fs::remove(path / kManifestName);
        for (const std::string& e : test_support::dir_entries(path)) {
          fs::remove(path / e);
          break;
        }
      }
      throw SimulatedCrash{};
    };
    const Schedule keep2({.keep_last = 2});
    EXPECT_THROW(policy::apply_retention(dir.path(), keep2, kSteps, probe), SimulatedCrash);
    const auto check_all = [&] {
      for (const Listed& l : list(dir.path())) {
        if (l.temporary) continue;
        ASSERT_TRUE(l.committed) << l.name << ": " << l.problem;
        const int step = static_cast<int>(l.manifest->metadata.at("step").get<int64_t>());
        const StateDict expected = test_support::fine_tuning_state(step);
        const StateDict loaded = load(l.path);
        ASSERT_EQ(loaded.size(), expected.size()) << l.name;
        for (const auto& [key, entry] : expected) {
          EXPECT_TRUE(test_support::bitwise_equal(loaded.at(key), entry.tensor)) << l.name << key;
        }
      }
    };
    check_all();
    { pipeline::RootLock next(dir.path()); }
    policy::apply_retention(dir.path(), keep2, kSteps);
    EXPECT_EQ(snapshot_names(dir.path()),
              (std::vector<std::string>{format::step_name(kSteps - 1), format::step_name(kSteps)}));
    check_all();
  }
}

TEST(Retention, NeverRunsBeforeTheNewSnapshotCommits) {
  // The hook applies retention only after a commit: a save that fails at its rename leaves
  // every older snapshot in place.
  TempDir dir;
  StateDict sd = test_support::small_state(1);
  {
    test_support::LogLines log;
    Snapshotter snap(test_support::small_options(dir.path()));
    PeriodicSnapshots hook(snap, Schedule({.every_steps = 1, .keep_last = 1}),
                           [&] { return test_support::checkpoint_of(sd); },
                           {.when_busy = WhenBusy::kWait, .log = log.sink()});
    hook.after_step(1);
    hook.after_step(2);
    hook.finish();
    EXPECT_EQ(snapshot_names(dir.path()), std::vector<std::string>{"step-00000002"});
  }
  struct FailRename : io::ForwardingEngine {
    using ForwardingEngine::ForwardingEngine;
    int rename(const std::string&, const std::string&, io::RenameMode) override { return -EIO; }
  };
  Snapshotter snap =
      test_support::on_engine(std::make_shared<FailRename>(io::make_pwrite_engine(2)),
                              [&] { return Snapshotter(test_support::small_options(dir.path())); });
  test_support::LogLines log;
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 1, .keep_last = 1}),
                         [&] { return test_support::checkpoint_of(sd); }, {.log = log.sink()});
  hook.after_step(3);
  EXPECT_THROW(hook.finish(), IoError);
  EXPECT_EQ(hook.stats().failed, 1);
  EXPECT_EQ(log.count("step-00000003 FAILED (steps)"), 1);
  EXPECT_EQ(snapshot_names(dir.path()), std::vector<std::string>{"step-00000002"});
  EXPECT_NO_THROW(load(dir / "step-00000002"));
}

}  // namespace
}  // namespace tsnap
