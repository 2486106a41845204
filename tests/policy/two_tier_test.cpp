// PeriodicSnapshots on a two-tier Snapshotter (SnapshotterOptions::tier.durable_root): the
// schedule's keep rules on each tier after each drain, the local tier never losing an undrained
// snapshot, finish() waiting for the drain, and resume from both tiers (the durable one alone when
// the local disk is lost).

#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "format/layout.h"
#include "policy/retention.h"
#include "policy_test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/load.h"
#include "tsnap/remove.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::dir_entries;
using test_support::TempDir;

SnapshotterOptions two_tier(const fs::path& local, const fs::path& durable, int keep_local) {
  SnapshotterOptions o = test_support::small_options(local);
  o.tier.durable_root = durable;
  o.tier.local_keep_last = keep_local;
  return o;
}

std::vector<std::string> steps(std::initializer_list<int64_t> list) {
  std::vector<std::string> out;
  for (int64_t s : list) out.push_back(format::step_name(s));
  return out;
}

TEST(TwoTier, KeepRulesApplyToEachTierAfterTheDrain) {
  TempDir local, durable;
  Snapshotter snap(two_tier(local.path(), durable.path(), /*keep_local=*/1));
  StateDict sd = test_support::small_state(1);
  test_support::LogLines log;
  {
    PeriodicSnapshots hook(snap, Schedule({.every_steps = 10, .keep_last = 3}),
                           [&] { return test_support::checkpoint_of(sd); },
                           {.when_busy = WhenBusy::kWait, .log = log.sink()});
    for (int64_t step = 1; step <= 60; ++step) hook.after_step(step);
    const PeriodicStats stats = hook.finish();  // waits for the drain too
    EXPECT_EQ(stats.snapshots.size(), 6u);
  }
  // Durable: the schedule's keep_last 3; local: local_keep_last 1 (everything drained).
  EXPECT_EQ(dir_entries(durable.path()), steps({40, 50, 60}));
  EXPECT_EQ(dir_entries(local.path()), steps({60}));
  for (const std::string& name : dir_entries(durable.path())) {
    EXPECT_TRUE(verify(durable / name).empty()) << name;
  }
  EXPECT_GE(log.count("drained to " + durable.path().string()), 6);
}

TEST(TwoTier, LocalRetentionKeepsWhatIsNotDrained) {
  TempDir local, durable;
  Snapshotter snap(two_tier(local.path(), durable.path(), /*keep_local=*/0));
  for (int64_t step : {10, 20, 30}) {
    test_support::save_step(local.path(), format::step_name(step), step,
                            test_support::small_state(step));
  }
  snap.drain_wait();
  for (int64_t step : {40, 50}) {  // not drained (no pass runs until the next request)
    test_support::save_step(local.path(), format::step_name(step), step,
                            test_support::small_state(step));
  }
  // keep_last 1 expires 10 to 40; the guard refuses 40, which is not in the durable tier.
  const auto deleted =
      policy::apply_retention(local.path(), Schedule({.every_steps = 10, .keep_last = 1}), 50, {},
                              [&](const std::string& name) { return snap.drained(name); });
  EXPECT_EQ(deleted, steps({10, 20, 30}));
  EXPECT_EQ(dir_entries(local.path()), steps({40, 50}));
  EXPECT_FALSE(snap.drained(format::step_name(40)));
}

TEST(TwoTier, ResumesFromTheDurableTierWhenTheLocalDiskIsLost) {
  TempDir durable;
  const StateDict at30 = test_support::small_state(30);
  {
    TempDir local;
    Snapshotter snap(two_tier(local.path(), durable.path(), 2));
    StateDict sd = test_support::small_state(0);
    PeriodicSnapshots hook(snap, Schedule({.every_steps = 10}),
                           [&] { return test_support::checkpoint_of(sd); },
                           {.when_busy = WhenBusy::kWait, .log = nullptr});
    for (int64_t step = 1; step <= 30; ++step) {
      sd = test_support::small_state(step);
      hook.after_step(step);
    }
    hook.finish();
  }  // the local disk is gone
  TempDir fresh;
  Snapshotter snap(two_tier(fresh.path(), durable.path(), 2));
  EXPECT_EQ(*snap.latest(), durable / format::step_name(30));
  StateDict sd = test_support::small_state(999);
  test_support::LogLines log;
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 10}),
                         [&] { return test_support::checkpoint_of(sd); }, {.log = log.sink()});
  EXPECT_EQ(hook.resume([&](Checkpoint& c) { c.apply({{"state", sd}}); }), 30);
  EXPECT_TRUE(bitwise_equal(sd.at("w"), at30.at("w")));
  EXPECT_EQ(log.count("resumed from " + (durable / format::step_name(30)).string()), 1);
}

TEST(TwoTier, ResumePrefersTheLocalCopyAndFallsBackToTheDurableOne) {
  TempDir local, durable;
  Snapshotter snap(two_tier(local.path(), durable.path(), 0));
  test_support::save_step(local.path(), format::step_name(10), 10, test_support::small_state(10));
  snap.drain_wait();
  // The local copy goes bad after its drain: resume skips it and loads the durable copy.
  for (const auto& e : fs::directory_iterator(local / format::step_name(10))) {
    if (e.path().extension() == ".safetensors") test_support::flip_byte(e.path(), 4096 + 3);
  }
  StateDict sd = test_support::small_state(999);
  test_support::LogLines log;
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 10}),
                         [&] { return test_support::checkpoint_of(sd); }, {.log = log.sink()});
  EXPECT_EQ(hook.resume([&](Checkpoint& c) { c.apply({{"state", sd}}); }), 10);
  EXPECT_TRUE(bitwise_equal(sd.at("w"), test_support::small_state(10).at("w")));
  EXPECT_EQ(log.count("resume skips step-00000010"), 1);
  EXPECT_EQ(log.count("resumed from " + (durable / format::step_name(10)).string()), 1);
}

}  // namespace
}  // namespace tsnap
