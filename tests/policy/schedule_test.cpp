// Schedule: validation, due-ness by step count, which steps retention expires; snapshot names.

#include "tsnap/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <csignal>

#include "policy/retention.h"
#include "tsnap/error.h"

namespace tsnap {
namespace {

TEST(Schedule, DueEveryNSteps) {
  const Schedule every3({.every_steps = 3});
  std::vector<int64_t> due;
  for (int64_t step = 0; step <= 10; ++step) {
    if (every3.due_at_step(step)) due.push_back(step);
  }
  EXPECT_EQ(due, (std::vector<int64_t>{3, 6, 9}));
  const Schedule never({.every_seconds = 5});
  for (int64_t step = 0; step <= 10; ++step) EXPECT_FALSE(never.due_at_step(step));
}

// Snapshots at `steps`, created one minute apart in step order, without metrics.
std::vector<SnapshotFacts> at(const std::vector<int64_t>& steps) {
  std::vector<SnapshotFacts> out;
  for (int64_t step : steps) out.push_back({step, 60.0 * static_cast<double>(step), {}});
  return out;
}

TEST(Schedule, ExpiredKeepsLastKAndEveryMth) {
  const Schedule s({.keep_last = 2, .keep_every_steps = 4});
  EXPECT_EQ(s.expired(at({10, 1, 2, 3, 4, 5, 6, 7, 8, 9})),
            (std::vector<int64_t>{1, 2, 3, 5, 6, 7}));
  EXPECT_TRUE(s.expired(at({3, 7})).empty());
  EXPECT_TRUE(Schedule({.keep_every_steps = 4}).expired(at({1, 2, 3, 5})).empty());  // keep all
  EXPECT_EQ(Schedule({.keep_last = 1}).expired(at({5, 2, 9})), (std::vector<int64_t>{2, 5}));
}

TEST(Schedule, DueAtGivenSteps) {
  const Schedule s({.every_steps = 5, .at_steps = {3, 7, 10}});
  std::vector<int64_t> due;
  for (int64_t step = 0; step <= 12; ++step) {
    if (s.due_at_step(step)) due.push_back(step);
  }
  EXPECT_EQ(due, (std::vector<int64_t>{3, 5, 7, 10}));
}

TEST(Schedule, ContinuousAndAdaptiveIntervals) {
  EXPECT_FALSE(Schedule({.every_steps = 5}).continuous_interval(1.0));
  EXPECT_EQ(Schedule({.continuous = true}).continuous_interval(1.0), 0.0);
  EXPECT_EQ(Schedule({.continuous = true, .min_interval_seconds = 30}).continuous_interval(1.0),
            30.0);
  // Adaptive: 0.2 s blocked at a 1 % budget: at least 20 s apart; never under the minimum.
  EXPECT_DOUBLE_EQ(*Schedule({.max_overhead = 0.01}).continuous_interval(0.2), 20.0);
  EXPECT_DOUBLE_EQ(
      *Schedule({.min_interval_seconds = 60, .max_overhead = 0.01}).continuous_interval(0.2), 60.0);
}

TEST(Schedule, KeepOnePerTimeWindow) {
  // Created at 0, 20, 40, ... 200 s; one per 60 s window kept, plus the newest.
  std::vector<SnapshotFacts> snaps;
  for (int64_t i = 0; i <= 10; ++i) snaps.push_back({i + 1, 20.0 * static_cast<double>(i), {}});
  const Schedule s({.keep_every_seconds = 60});
  // Kept: steps 1 (0 s), 4 (60 s), 7 (120 s), 10 (180 s), 11 (newest).
  EXPECT_EQ(s.expired(snaps), (std::vector<int64_t>{2, 3, 5, 6, 8, 9}));
  EXPECT_TRUE(s.retains());
}

TEST(Schedule, KeepBestByMetric) {
  std::vector<SnapshotFacts> snaps = at({1, 2, 3, 4, 5, 6});
  const double loss[] = {0.9, 0.5, 0.7, 0.4, 0.8, 0.6};
  for (size_t i = 0; i < snaps.size(); ++i) snaps[i].metric = loss[i];
  snaps[2].metric.reset();  // step 3 has no metric
  EXPECT_EQ(Schedule({.keep_best = 2, .best_metric = "loss"}).expired(snaps),
            (std::vector<int64_t>{1, 5}));  // best 4 and 2, no-metric 3, newest 6
  EXPECT_EQ(Schedule({.keep_best = 2, .best_metric = "loss", .keep_without_metric = false})
                .expired(snaps),
            (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(Schedule({.keep_best = 2,
                      .best_metric = "acc",
                      .best_mode = ScheduleOptions::Mode::kMax,
                      .keep_without_metric = false})
                .expired(snaps),
            (std::vector<int64_t>{2, 3, 4}));  // best 1 (0.9) and 5 (0.8), newest 6
}

TEST(Schedule, KeepRulesCombine) {
  std::vector<SnapshotFacts> snaps = at({10, 20, 30, 40, 50, 60, 70, 80});
  for (size_t i = 0; i < snaps.size(); ++i) snaps[i].metric = static_cast<double>(i % 3);
  // Kept: last 2 (70, 80), multiples of 40 (40, 80), best 1 by min (metric 0: 10, 40, 70 ->
  // the newest of the ties, 70).
  const Schedule s({.keep_last = 2, .keep_every_steps = 40, .keep_best = 1, .best_metric = "m"});
  EXPECT_EQ(s.expired(snaps), (std::vector<int64_t>{10, 20, 30, 50, 60}));
}

TEST(Schedule, RejectsBadOptions) {
  EXPECT_THROW(Schedule({.every_steps = -1}), InvalidArgument);
  EXPECT_THROW(Schedule({.every_seconds = -1}), InvalidArgument);
  EXPECT_THROW(Schedule({.every_seconds = std::nan("")}), InvalidArgument);
  EXPECT_THROW(Schedule({.keep_last = -2}), InvalidArgument);
  EXPECT_THROW(Schedule({.keep_every_steps = -3}), InvalidArgument);
  EXPECT_THROW(Schedule({.on_signals = {SIGKILL}}), InvalidArgument);
  EXPECT_THROW(Schedule({.on_signals = {SIGSTOP}}), InvalidArgument);
  EXPECT_THROW(Schedule({.on_signals = {0}}), InvalidArgument);
  EXPECT_THROW(Schedule({.on_signals = {SIGTERM, SIGUSR1, SIGTERM}}), InvalidArgument);
  EXPECT_THROW(Schedule({.at_steps = {5, 0}}), InvalidArgument);
  EXPECT_THROW(Schedule({.min_interval_seconds = -1}), InvalidArgument);
  EXPECT_THROW(Schedule({.max_overhead = 1.5}), InvalidArgument);
  EXPECT_THROW(Schedule({.max_overhead = std::nan("")}), InvalidArgument);
  EXPECT_THROW(Schedule({.keep_every_seconds = -1}), InvalidArgument);
  EXPECT_THROW(Schedule({.keep_best = 2}), InvalidArgument);  // no metric named
  EXPECT_THROW(Schedule({.keep_best = -1, .best_metric = "loss"}), InvalidArgument);
  EXPECT_NO_THROW(Schedule({.on_signals = {SIGTERM, SIGUSR1}}));
}

}  // namespace
}  // namespace tsnap
