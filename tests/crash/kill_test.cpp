// Crash tests (label `crash`): a child process saves snapshots in a loop and is killed with
// SIGKILL at a random moment; the parent then checks that every committed snapshot is complete
// and verifies, that the snapshot committed before the child started is intact, and that
// nothing that is not committed looks committed.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <thread>

#include "crash/child_process.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/load.h"
#include "tsnap/save.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::make_tensor;
using test_support::TempDir;

StateDict state(uint64_t seed) {
  StateDict sd;
  for (int i = 0; i < 4; ++i)
    sd.insert("w" + std::to_string(i), make_tensor(at::kFloat, {1 << 20}, seed + i));
  return sd;
}

// The child: run as this same program (exec, so that no thread state is inherited through
// fork) with TSNAP_CRASH_ROOT set; it saves until it is killed.
TEST(Crash, ChildProcess) {
  const char* root_env = std::getenv("TSNAP_CRASH_ROOT");
  if (root_env == nullptr) GTEST_SKIP() << "runs only as the child of KilledSave...";
  const std::filesystem::path root = root_env;
  try {
    Snapshotter snap({.root = root, .chunk_bytes = 1 << 20, .staging = {.budget_bytes = 8 << 20}});
    StateDict sd = state(100);
    for (int step = 1;; ++step) {
      // New names and overwrites of one name, to crash inside both commit paths.
      snap.save_async("step-" + std::to_string(step), sd, {{"step", step}}).wait();
      snap.save_async("latest", sd, {{"step", step}}, {.overwrite = true}).wait();
    }
  } catch (...) {
  }
  _exit(3);
}

pid_t spawn_child(const std::filesystem::path& root) {
  return crash_test::spawn_self("Crash.ChildProcess", {{"TSNAP_CRASH_ROOT", root.string()}});
}

TEST(Crash, KilledSaveNeverCorruptsCommittedSnapshots) {
  std::mt19937 rng(12345);
  for (int round = 0; round < 8; ++round) {
    TempDir dir;
    const StateDict first = state(1);
    save(dir / "first", first, {{"step", 0}});
    const pid_t pid = spawn_child(dir.path());
    ASSERT_GE(pid, 0);
    // LibTorch takes about a second to load in the child; then saves run every few ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500 + rng() % 1000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child ended on its own: " << status;

    // The snapshot from before the child is intact.
    const StateDict back = load(dir / "first");
    for (const auto& [k, e] : first) EXPECT_TRUE(bitwise_equal(e.tensor, back.at(k))) << k;
    // Every committed directory verifies and loads; the rest are temporaries.
    int committed = 0;
    for (const Listed& l : list(dir.path())) {
      if (l.committed) {
        ++committed;
        EXPECT_TRUE(verify(l.path).empty()) << l.name;
        EXPECT_NO_THROW(load(l.path)) << l.name;
      } else {
        EXPECT_TRUE(l.temporary) << l.name << ": " << l.problem;
      }
    }
    EXPECT_GE(committed, 1);
    EXPECT_TRUE(latest(dir.path()).has_value());
  }
}

}  // namespace
}  // namespace tsnap
