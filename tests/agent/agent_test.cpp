// Snapshot agent tests (label `agent`): a trainer's saves outlive it (tsnap/agent.h). The agent
// runs in this test process; trainers are children (this program started again by exec, so that
// no thread state is inherited through fork) that save in a loop and report each save_async that
// returned; the parent kills them with SIGKILL at random points and checks that every reported
// save is committed, bit for bit.

#include "tsnap/agent.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "crash/child_process.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/checkpoint.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/periodic_snapshots.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::make_tensor;
using test_support::TempDir;

constexpr uint64_t kChunk = 64 << 10;

// The state of training step `step`: different bytes at every step.
StateDict state(int step) {
  StateDict sd;
  for (int i = 0; i < 6; ++i) {
    sd.insert("layer" + std::to_string(i),
              make_tensor(at::kFloat, {40000 + 1000 * i}, step * 16 + i));
  }
  sd.insert("step", at::full({}, step, at::kLong));
  return sd;
}

void expect_state(const StateDict& got, int step, const std::string& what) {
  const StateDict want = state(step);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [key, entry] : want) {
    ASSERT_TRUE(bitwise_equal(got.at(key), entry.tensor)) << what << ": " << key;
  }
}

SnapshotterOptions options(const fs::path& root, const fs::path& socket) {
  SnapshotterOptions o;
  o.root = root;
  o.chunk_bytes = kChunk;
  o.agent.socket = socket;
  return o;
}

// The trainer: saves steps START.. until killed (or 8 of them), writing each step to fd
// TSNAP_AGENT_REPORT once its save_async returned; never waits for a save to commit.
TEST(AgentChild, Trainer) {
  const char* root = std::getenv("TSNAP_AGENT_ROOT");
  if (root == nullptr) GTEST_SKIP() << "runs only as a child of the agent tests";
  const int report = std::atoi(std::getenv("TSNAP_AGENT_REPORT"));
  const int start = std::atoi(std::getenv("TSNAP_AGENT_START"));
  const bool wait_each = std::getenv("TSNAP_AGENT_WAIT") != nullptr;
  try {
    Snapshotter snap(options(root, std::getenv("TSNAP_AGENT_SOCKET")));
    for (int step = start; step < start + 8; ++step) {
      SaveHandle h = snap.save_async("step-" + std::to_string(step), state(step));
      h.wait_staged();  // a save the agent did not take fails here
      if (wait_each) h.wait();
      const int32_t s = step;
      if (::write(report, &s, sizeof(s)) != sizeof(s)) _exit(4);
    }
    snap.wait_all();
  } catch (const std::exception& e) {
    fprintf(stderr, "trainer failed: %s\n", e.what());
    _exit(3);
  }
  const int32_t end = -1;
  (void)!::write(report, &end, sizeof(end));
  pause();  // the parent kills it
  _exit(0);
}

struct Trainer {
  pid_t pid = -1;
  int report = -1;  // read end
};

Trainer spawn_trainer(const fs::path& root, const fs::path& socket, int start, bool wait_each) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  std::vector<std::pair<std::string, std::string>> env = {
      {"TSNAP_AGENT_ROOT", root.string()},
      {"TSNAP_AGENT_SOCKET", socket.string()},
      {"TSNAP_AGENT_REPORT", std::to_string(fds[1])},
      {"TSNAP_AGENT_START", std::to_string(start)}};
  if (wait_each) env.push_back({"TSNAP_AGENT_WAIT", "1"});
  Trainer t;
  t.pid = crash_test::spawn_self("AgentChild.Trainer", env);
  ::close(fds[1]);
  t.report = fds[0];
  return t;
}

// The next step the trainer reported (-1: it finished its saves; 0: it exited or timed out).
int next_report(const Trainer& t, int timeout_ms = 60000) {
  pollfd p{t.report, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return 0;
  int32_t s = 0;
  return ::read(t.report, &s, sizeof(s)) == sizeof(s) ? s : 0;
}

void kill_and_reap(Trainer& t) {
  ::kill(t.pid, SIGKILL);
  int status = 0;
  ::waitpid(t.pid, &status, 0);
  ::close(t.report);
}

fs::path socket_in(const TempDir& dir) { return dir / "agent.sock"; }

TEST(Agent, EverySaveThatReturnedIsCommittedAfterTheTrainerIsKilled) {
  TempDir dir;
  Agent agent({.socket = socket_in(dir)});
  std::mt19937 rng(20261205);
  constexpr int kLanes = 2;  // trainers at once, on roots of their own
  const int points =
      std::getenv("TSNAP_AGENT_POINTS") ? std::atoi(std::getenv("TSNAP_AGENT_POINTS")) : 104;
  std::vector<int> next_step(kLanes, 1);
  std::vector<std::set<int>> returned(kLanes);
  int killed_after_return = 0;
  for (int point = 0; point < points; point += kLanes) {
    std::vector<Trainer> trainers;
    std::vector<int> last(kLanes, 0);
    for (int lane = 0; lane < kLanes; ++lane) {
      trainers.push_back(spawn_trainer(dir / ("root" + std::to_string(lane)), agent.socket(),
                                       next_step[lane], false));
    }
    for (int lane = 0; lane < kLanes; ++lane) {
      // Kill after a random number of returned saves (1-4), a random moment later (0-8 ms):
      // while the trainer writes, commits, or stages the next one.
      const int saves = std::uniform_int_distribution<int>(1, 4)(rng);
      for (int i = 0; i < saves; ++i) {
        const int s = next_report(trainers[lane]);
        ASSERT_GT(s, 0) << "trainer " << lane << " stopped reporting at point " << point;
        returned[lane].insert(s);
        last[lane] = s;
      }
      std::this_thread::sleep_for(
          std::chrono::microseconds(std::uniform_int_distribution<int>(0, 8000)(rng)));
      kill_and_reap(trainers[lane]);
      ++killed_after_return;
    }
    agent.wait_unlinked();
    for (int lane = 0; lane < kLanes; ++lane) {
      // Every returned save is committed (by the trainer or the agent).
      const fs::path root = dir / ("root" + std::to_string(lane));
      for (int s : returned[lane]) {
        const fs::path snap = root / ("step-" + std::to_string(s));
        ASSERT_TRUE(fs::exists(snap / kManifestName)) << snap << " lost at point " << point;
      }
      next_step[lane] = last[lane] + 8;  // past anything the killed trainer may have started
    }
  }
  // Each committed snapshot holds its step's state, bit for bit (checked once, at the end).
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int s : returned[lane]) {
      const fs::path snap = dir / ("root" + std::to_string(lane)) / ("step-" + std::to_string(s));
      expect_state(load(snap), s, snap.string());
    }
  }
  EXPECT_EQ(killed_after_return, points);
  RecordProperty("agent_commits", std::to_string(agent.commits()));
  std::cout << "kill points: " << points
            << ", saves returned: " << returned[0].size() + returned[1].size()
            << ", committed by the agent: " << agent.commits() << std::endl;
  EXPECT_GT(agent.commits(), 0u) << "no kill landed before a trainer's own commit";
}

TEST(Agent, RestartedTrainerResumesFromTheAgentsMemoryWithoutTheDisk) {
  TempDir dir;
  Agent agent({.socket = socket_in(dir)});
  const fs::path root = dir / "root";
  Trainer t = spawn_trainer(root, agent.socket(), 1, /*wait_each=*/true);
  int last = 0;
  for (int s; (s = next_report(t)) > 0;) last = s;
  ASSERT_EQ(last, 8);
  kill_and_reap(t);
  agent.wait_unlinked();
  // Every snapshot on the disk is gone: only the agent's memory holds step 8.
  for (const fs::directory_entry& e : fs::directory_iterator(root)) fs::remove_all(e.path());
  Snapshotter snap(options(root, agent.socket()));
  HotSnapshot hot = snap.hot_snapshot();
  ASSERT_TRUE(hot);
  EXPECT_EQ(hot.name(), "step-8");
  expect_state(load(hot), 8, "hot snapshot adopted from the agent");
  // The adopted pool serves the next saves as usual.
  snap.save_async("step-9", state(9)).wait();
  expect_state(load(root / "step-9"), 9, "save after the restart");
  EXPECT_EQ(snap.hot_snapshot().name(), "step-9");
}

TEST(Agent, PeriodicSnapshotsResumeFromTheAgentsMemory) {
  TempDir dir;
  Agent agent({.socket = socket_in(dir)});
  const fs::path root = dir / "root";
  StateDict sd = state(0);
  auto make = [&] { return Checkpoint::of({{"state", sd}}); };
  {
    Snapshotter snap(options(root, agent.socket()));
    PeriodicSnapshots hook(snap, Schedule({.every_steps = 2}), make,
                           {.when_busy = WhenBusy::kWait, .log = nullptr});
    for (int64_t step = 1; step <= 6; ++step) {
      sd = state(static_cast<int>(step));
      hook.after_step(step);
    }
    hook.finish();
  }
  agent.wait_unlinked();
  // Nothing on the disk: the newest snapshot (step 6) is in the agent's memory only.
  for (const fs::directory_entry& e : fs::directory_iterator(root)) fs::remove_all(e.path());
  Snapshotter snap(options(root, agent.socket()));
  std::vector<std::string> lines;
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 2}), make,
                         {.log = [&](const std::string& l) { lines.push_back(l); }});
  StateDict back = state(0);
  EXPECT_EQ(hook.resume([&](Checkpoint& c) { c.apply({{"state", back}}); }), 6);
  expect_state(back, 6, "resumed from memory");
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("in memory"), std::string::npos) << lines.back();
}

TEST(Agent, SavesFailClearlyOrFallBackWhenTheAgentIsGone) {
  TempDir dir;
  const fs::path socket = socket_in(dir);
  // No agent at construction.
  try {
    Snapshotter snap(options(dir / "a", socket));
    FAIL() << "linked to no agent";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(socket.string()), std::string::npos) << e.what();
  }
  SnapshotterOptions fb = options(dir / "b", socket);
  fb.agent.fall_back = true;
  Snapshotter alone(fb);
  alone.save_async("s1", state(1)).wait();
  expect_state(load(dir / "b" / "s1"), 1, "fall back without an agent");

  // The agent goes away under a linked Snapshotter.
  auto agent = std::make_unique<Agent>(AgentOptions{.socket = socket});
  Snapshotter strict(options(dir / "c", socket));
  SnapshotterOptions fbo = options(dir / "d", socket);
  fbo.agent.fall_back = true;
  Snapshotter lenient(fbo);
  strict.save_async("s1", state(1)).wait();
  agent.reset();
  bool failed = false;
  try {
    strict.save_async("s2", state(2)).wait();
  } catch (const Error& e) {
    failed = true;
    EXPECT_NE(std::string(e.what()).find("snapshot agent"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(failed);
  EXPECT_FALSE(fs::exists(dir / "c" / "s2")) << "a save the agent did not hold was committed";
  lenient.save_async("s2", state(2)).wait();
  expect_state(load(dir / "d" / "s2"), 2, "fall back after the agent went");
}

TEST(Agent, OneLiveTrainerPerRootManyRootsPerAgent) {
  TempDir dir;
  Agent agent({.socket = socket_in(dir)});
  Snapshotter a(options(dir / "a", agent.socket()));
  Snapshotter b(options(dir / "b", agent.socket()));
  EXPECT_EQ(agent.links(), 2u);
  try {
    Snapshotter again(options(dir / "a", agent.socket()));
    FAIL() << "two live trainers on one root";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBusy) << e.what();
  }
  a.save_async("x", state(1)).wait();
  b.save_async("x", state(2)).wait();
  expect_state(load(dir / "a" / "x"), 1, "root a");
  expect_state(load(dir / "b" / "x"), 2, "root b");
  EXPECT_EQ(agent.commits(), 0u) << "the agent committed for a live trainer";
}

TEST(Agent, RefusesASecondAgentOnTheSameSocket) {
  TempDir dir;
  Agent agent({.socket = socket_in(dir)});
  EXPECT_THROW(Agent({.socket = socket_in(dir)}), Error);
}

}  // namespace
}  // namespace tsnap
