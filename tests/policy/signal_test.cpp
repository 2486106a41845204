// Preemption signals: the next step boundary takes a final snapshot and waits for its commit,
// then stop_requested() turns true; handlers installed before the hook are chained and come back
// when it is destroyed.

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "format/layout.h"
#include "policy/retention.h"
#include "policy_test_util.h"
#include "support/on_engine.h"
#include "tsnap/load.h"
#include "tsnap/periodic_snapshots.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;

volatile sig_atomic_t g_plain_calls = 0;
volatile sig_atomic_t g_info_signo = 0;
volatile sig_atomic_t g_info_calls = 0;

void plain_handler(int) { g_plain_calls = g_plain_calls + 1; }
void info_handler(int, siginfo_t* info, void*) {
  g_info_signo = info->si_signo;
  g_info_calls = g_info_calls + 1;
}

struct sigaction action_of(int sig) {
  struct sigaction a {};
  ::sigaction(sig, nullptr, &a);
  return a;
}

// Steps (a few milliseconds each) until the hook stops; returns the step it stopped at.
int64_t run_until_stopped(PeriodicSnapshots& hook, int64_t first) {
  for (int64_t step = first; step < first + 2000; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    hook.after_step(step);
    if (hook.stop_requested()) return step;
  }
  return -1;
}

class SignalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int sig : {SIGUSR1, SIGUSR2}) saved_[sig] = action_of(sig);
  }
  void TearDown() override {
    for (int sig : {SIGUSR1, SIGUSR2}) ::sigaction(sig, &saved_[sig], nullptr);
  }
  struct sigaction saved_[NSIG] {};
  TempDir dir_;
  StateDict state_ = test_support::small_state(11);
  PeriodicSnapshots make_hook(Snapshotter& snap, std::vector<int> signals) {
    return PeriodicSnapshots(snap, Schedule({.every_steps = 1000, .on_signals = signals}),
                             [this] { return test_support::checkpoint_of(state_); },
                             {.log = log_.sink()});
  }
  test_support::LogLines log_;
};

TEST_F(SignalTest, FinalSnapshotCommitsThenStop) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGUSR2, &dfl, nullptr);  // default action: terminate, replaced by the hook
  Snapshotter snap(test_support::small_options(dir_.path()));
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 1000, .on_signals = {SIGUSR2}}),
                         [this] { return test_support::checkpoint_of(state_); },
                         {.log = log_.sink()});
  hook.after_step(1);
  hook.after_step(2);
  EXPECT_FALSE(hook.stop_requested());
  EXPECT_EQ(hook.stop_signal(), 0);
  ::raise(SIGUSR2);
  const int64_t stopped_at = run_until_stopped(hook, 3);
  ASSERT_GE(stopped_at, 3);
  EXPECT_EQ(hook.stop_signal(), SIGUSR2);
  // Committed before stop_requested() turned true.
  EXPECT_NO_THROW(load(dir_ / format::step_name(stopped_at)));
  const PeriodicStats stats = hook.stats();
  ASSERT_EQ(stats.snapshots.size(), 1u);
  EXPECT_EQ(stats.snapshots[0].reason, SnapshotReason::kSignal);
  EXPECT_TRUE(stats.snapshots[0].committed);
  EXPECT_EQ(log_.count("final snapshot committed, stop"), 1);
  hook.after_step(stopped_at + 1);  // nothing more once stopped
  EXPECT_EQ(hook.finish().snapshots.size(), 1u);
}

TEST_F(SignalTest, ChainsAPlainHandlerAndRestoresIt) {
  struct sigaction plain {};
  plain.sa_handler = plain_handler;
  sigemptyset(&plain.sa_mask);
  ::sigaction(SIGUSR1, &plain, nullptr);
  g_plain_calls = 0;
  {
    Snapshotter snap(test_support::small_options(dir_.path()));
    PeriodicSnapshots hook = make_hook(snap, {SIGUSR1});
    EXPECT_NE(action_of(SIGUSR1).sa_handler, plain_handler);
    ::raise(SIGUSR1);
    ASSERT_GE(run_until_stopped(hook, 1), 1);
    EXPECT_EQ(g_plain_calls, 1) << "the previous handler was not chained";
  }
  EXPECT_EQ(action_of(SIGUSR1).sa_handler, plain_handler);
  ::raise(SIGUSR1);  // the kernel calls it directly again
  EXPECT_EQ(g_plain_calls, 2);
}

TEST_F(SignalTest, ChainsASiginfoHandler) {
  struct sigaction info {};
  info.sa_sigaction = info_handler;
  info.sa_flags = SA_SIGINFO;
  sigemptyset(&info.sa_mask);
  ::sigaction(SIGUSR1, &info, nullptr);
  g_info_calls = 0;
  g_info_signo = 0;
  {
    Snapshotter snap(test_support::small_options(dir_.path()));
    PeriodicSnapshots hook = make_hook(snap, {SIGUSR1, SIGUSR2});
    ::raise(SIGUSR1);
    ASSERT_GE(run_until_stopped(hook, 1), 1);
    EXPECT_EQ(hook.stop_signal(), SIGUSR1);
  }
  EXPECT_EQ(g_info_calls, 1);
  EXPECT_EQ(g_info_signo, SIGUSR1);
  const struct sigaction after = action_of(SIGUSR1);
  EXPECT_EQ(after.sa_sigaction, info_handler);
  EXPECT_TRUE(after.sa_flags & SA_SIGINFO);
  EXPECT_EQ(action_of(SIGUSR2).sa_handler, saved_[SIGUSR2].sa_handler);
}

TEST_F(SignalTest, IgnoredSignalIsRestoredAsIgnored) {
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGUSR1, &ign, nullptr);
  {
    Snapshotter snap(test_support::small_options(dir_.path()));
    PeriodicSnapshots hook = make_hook(snap, {SIGUSR1});
    ::raise(SIGUSR1);  // the schedule asked for it: it stops training even so
    ASSERT_GE(run_until_stopped(hook, 1), 1);
  }
  EXPECT_EQ(action_of(SIGUSR1).sa_handler, SIG_IGN);
  ::raise(SIGUSR1);  // ignored: the test goes on
}

TEST_F(SignalTest, FinalSnapshotWaitsForTheSaveInFlight) {
  auto gate = std::make_shared<test_support::GateEngine>();
  Snapshotter snap = test_support::on_engine(
      gate, [&] { return Snapshotter(test_support::small_options(dir_.path())); });
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 5, .on_signals = {SIGUSR1}}),
                         [this] { return test_support::checkpoint_of(state_); }, {.log = nullptr});
  for (int64_t step = 1; step <= 5; ++step) hook.after_step(step);  // step 5's commit waits
  ::raise(SIGUSR1);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gate->open_gate();
  });
  const int64_t stopped_at = run_until_stopped(hook, 6);
  opener.join();
  ASSERT_GE(stopped_at, 6);
  const PeriodicStats stats = hook.finish();
  ASSERT_EQ(stats.snapshots.size(), 2u);
  EXPECT_EQ(stats.snapshots[0].step, 5);
  EXPECT_EQ(stats.snapshots[1].step, stopped_at);
  EXPECT_EQ(stats.snapshots[1].reason, SnapshotReason::kSignal);
  EXPECT_TRUE(stats.snapshots[1].committed);
}

}  // namespace
}  // namespace tsnap
