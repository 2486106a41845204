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

TEST(Schedule, ExpiredKeepsLastKAndEveryMth) {
  const Schedule s({.keep_last = 2, .keep_every_steps = 4});
  EXPECT_EQ(s.expired({10, 1, 2, 3, 4, 5, 6, 7, 8, 9}), (std::vector<int64_t>{1, 2, 3, 5, 6, 7}));
  EXPECT_TRUE(s.expired({3, 7}).empty());
  EXPECT_TRUE(Schedule({.keep_every_steps = 4}).expired({1, 2, 3, 5}).empty());  // keep all
  EXPECT_EQ(Schedule({.keep_last = 1}).expired({5, 2, 9}), (std::vector<int64_t>{2, 5}));
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
  EXPECT_NO_THROW(Schedule({.on_signals = {SIGTERM, SIGUSR1}}));
}

}  // namespace
}  // namespace tsnap
