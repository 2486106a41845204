// Node-local roots (TierOptions::node_local, labels `dist`): ranks spawned as processes of this
// program (run_ranks.h) and grouped into simulated nodes, each node a local root of its own
// (`<dir>/node-<n>`), drained into one durable root (the test S3 server, or a directory). The
// parent checks what reached the durable root, deletes the nodes' disks, and restores.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "dist/run_ranks.h"
#include "support/s3_server.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/checkpoint.h"
#include "tsnap/dist_group.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/periodic_snapshots.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::make_tensor;
using test_support::Ranks;
using test_support::run_ranks;
using test_support::TempDir;

constexpr const char* kEntry = "NodeLocalRank.Run";

// --- What every rank holds ----------------------------------------------------------------------

// The global tensor of step `step` (64 rows of 32 Ki floats: 8 MiB), cut into rows by rank.
at::Tensor global_at(int step) {
  return make_tensor(at::kFloat, {64, 32768}, 500 + static_cast<uint64_t>(step));
}

std::pair<int64_t, int64_t> rows_of(int rank, int world) {
  const int64_t base = 64 / world, extra = 64 % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

// Rank `rank` of `world`'s state at `step`: its rows of the global, and replicated tensors
// (each written once, by the rank that tsnap assigns it to).
StateDict state_at(int rank, int world, int step) {
  StateDict sd;
  const auto [b, e] = rows_of(rank, world);
  sd.insert("g", global_at(step).narrow(0, b, e - b).contiguous(), {},
            ShardSpec{{64, 32768}, {b, 0}});
  for (int i = 0; i < 6; ++i) {
    sd.insert("rep." + std::to_string(i),
              make_tensor(at::kFloat, {50000 + 1000 * i}, 600 + 10 * step + i));
  }
  sd.insert("rep.step", at::full({1}, step, at::kLong));
  return sd;
}

// Whether `sd` (one process, whole tensors) is the state of `step`.
std::string compare_whole(const StateDict& sd, int step) {
  if (!bitwise_equal(sd.at("g"), global_at(step))) return "g differs";
  const StateDict want = state_at(0, 1, step);
  for (const auto& [key, entry] : want) {
    if (key != "g" && !bitwise_equal(sd.at(key), entry.tensor)) return key + " differs";
  }
  return "";
}

// --- The ranks ---------------------------------------------------------------------------------

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

void report(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }

std::string outcome_of(const std::function<void()>& f) {
  try {
    f();
    return "ok";
  } catch (const Error& e) {
    return "error " + std::string(to_string(e.code())) + " " + e.what();
  }
}

void run_rank() {
  const std::string scenario = env_or("TSNAP_DIST_SCENARIO");
  const fs::path dir = fs::path(env_or("TSNAP_DIST_ROOT")).parent_path();
  const int env_rank = std::atoi(env_or("RANK").c_str());
  const fs::path out = dir / ("rank-" + std::to_string(env_rank) + ".txt");
  DistOptions dopt;
  dopt.timeout = std::chrono::milliseconds(std::atoi(env_or("TSNAP_DIST_TIMEOUT_MS").c_str()));
  std::shared_ptr<DistGroup> group = DistGroup::from_env(dopt);
  const int rank = group->rank(), world = group->world_size();
  const int node_size = std::atoi(env_or("TSNAP_TEST_NODE_SIZE", "1").c_str());
  SnapshotterOptions o;
  o.root = dir / ("node-" + std::to_string(rank / node_size));
  o.staging.budget_bytes = 16 << 20;
  o.chunk_bytes = 256 << 10;
  o.group = group;
  o.tier.durable_root = env_or("TSNAP_TEST_DURABLE");
  o.tier.node_local = true;
  o.tier.local_keep_last = 0;
  o.tier.bytes_per_second = std::strtoull(env_or("TSNAP_TEST_RATE", "0").c_str(), nullptr, 10);
  const int kill_node = std::atoi(env_or("TSNAP_TEST_KILL_NODE", "-1").c_str());
  if (rank / node_size == kill_node) o.tier.bytes_per_second = 256 << 10;  // a share: ~5 s

  if (scenario == "save") {
    // Two saves, each rank's share drained; one node's ranks may be killed while they upload.
    Snapshotter snap(o);
    std::string text;
    for (int step = 1; step <= 2 && text.empty(); ++step) {
      SaveHandle h = snap.save_async("s" + std::to_string(step), state_at(rank, world, step));
      const std::string outcome = outcome_of([&] { h.wait(); });
      if (outcome != "ok") text = outcome;
    }
    if (rank / node_size == kill_node) {
      // Its drain is uploading its share (paced): the kill lands mid-upload.
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      ::raise(SIGKILL);
    }
    if (text.empty()) text = outcome_of([&] { snap.drain_wait(); });
    report(out, text);
  } else if (scenario == "drain") {
    // A restart that only drains what the nodes hold (another world size).
    Snapshotter snap(o);
    report(out, outcome_of([&] { snap.drain_wait(); }));
  } else if (scenario == "restore") {
    // Each rank loads its rows of the durable snapshot, another world size than the save's.
    const auto [b, e] = rows_of(rank, world);
    StateDict sd;
    sd.insert("g", at::zeros({e - b, 32768}, at::kFloat), {}, ShardSpec{{64, 32768}, {b, 0}});
    std::string text = outcome_of([&] { load_into(o.tier.durable_root / "s2", sd); });
    if (text == "ok" && !bitwise_equal(sd.at("g"), global_at(2).narrow(0, b, e - b))) {
      text = "rows differ";
    }
    report(out, text);
  } else if (scenario == "periodic" || scenario == "resume") {
    // Snapshots every 2 steps through the hook; "resume" resumes and says from where.
    Snapshotter snap(o);
    StateDict state = state_at(rank, world, 0);
    std::string resumed_from;
    PeriodicOptions po;
    po.log = [&](const std::string& line) {
      if (line.find("resumed from ") != std::string::npos) resumed_from = line;
    };
    PeriodicSnapshots hook(
        snap, Schedule({.every_steps = 2}),
        [&] {
          return Checkpoint::of({{"state", state}});
        },
        po);
    if (scenario == "periodic") {
      for (int step = 1; step <= 4; ++step) {
        state = state_at(rank, world, step);
        hook.after_step(step);
      }
      std::string text = outcome_of([&] { hook.finish(); });
      if (text == "ok") text = outcome_of([&] { snap.drain_wait(); });
      report(out, text);
      return;
    }
    StateDict whole;
    whole.insert("g", at::zeros({64, 32768}, at::kFloat));
    for (const auto& [key, entry] : state_at(0, 1, 0)) {
      if (key != "g") whole.insert(key, at::zeros_like(entry.tensor));
    }
    int64_t step = -1;
    std::string text = outcome_of([&] {
      step = hook.resume([&](Checkpoint& c) { c.apply({{"state", whole}}); });
    });
    if (text == "ok") {
      const std::string diff = compare_whole(whole, static_cast<int>(step));
      text = "resumed " + std::to_string(step) + (diff.empty() ? " equal" : " " + diff) +
             (resumed_from.find(o.root.string()) != std::string::npos ? " local" : " durable");
    }
    report(out, text);
  } else {
    report(out, "error unknown scenario " + scenario);
  }
}

TEST(NodeLocalRank, Run) {
  if (std::getenv("TSNAP_DIST_SCENARIO") == nullptr) GTEST_SKIP() << "runs only as a rank";
  try {
    run_rank();
  } catch (const std::exception& e) {
    const fs::path dir = fs::path(env_or("TSNAP_DIST_ROOT")).parent_path();
    report(dir / ("rank-" + env_or("RANK") + ".txt"), std::string("error thrown ") + e.what());
  }
  std::_Exit(0);  // skip static destructors
}

// --- The parent --------------------------------------------------------------------------------

// Runs `scenario` on `world` ranks, `node_size` per node, and clears the ranks' reports first.
Ranks run_nodes(const std::string& scenario, int world, int node_size, const TempDir& dir) {
  for (int r = 0; r < 16; ++r) fs::remove(dir / ("rank-" + std::to_string(r) + ".txt"));
  ::setenv("TSNAP_TEST_NODE_SIZE", std::to_string(node_size).c_str(), 1);
  return run_ranks(scenario, world, dir.path(), 30000, std::chrono::seconds(120), kEntry);
}

void expect_all(const Ranks& ranks, const std::string& text) {
  for (size_t r = 0; r < ranks.texts.size(); ++r) {
    EXPECT_EQ(ranks.texts[r], text) << "rank " << r << "\n" << ranks.errs[r];
  }
}

// Each node's copy: the full manifest, and the files of that node's ranks only.
void expect_node_copies(const TempDir& dir, const std::string& name, int nodes, int node_size) {
  for (int n = 0; n < nodes; ++n) {
    const fs::path copy = dir / ("node-" + std::to_string(n)) / name;
    const Manifest m = read_manifest(copy);
    for (const FileRecord& f : m.files) {
      const bool ours = f.rank / node_size == n;
      EXPECT_EQ(fs::exists(copy / f.name), ours) << copy / f.name << " of rank " << f.rank;
    }
  }
}

class S3Durable : public ::testing::Test {
 protected:
  void SetUp() override {
    test_support::S3Server& s3 = test_support::S3Server::shared();
    if (!s3.available()) GTEST_SKIP() << s3.why();
    s3.export_environment();
    static int n = 0;
    const std::string bucket =
        "tsnap-nodes-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    io::S3Client(s3.config()).create_bucket(bucket);
    durable_ = "s3://" + bucket + "/run";
    ::setenv("TSNAP_TEST_DURABLE", durable_.c_str(), 1);
    ::setenv("TSNAP_TEST_RATE", "0", 1);
    ::setenv("TSNAP_TEST_KILL_NODE", "-1", 1);
  }
  std::string durable_;
};

// 8 ranks as 4 nodes: every rank drains its node's share, the last one publishes; with every
// node's disk gone, 3 ranks and one process restore from the store, bit for bit.
TEST_F(S3Durable, EightRanksOnFourNodesDrainInParallelAndRestoreElsewhere) {
  TempDir dir;
  expect_all(run_nodes("save", 8, 2, dir), "ok");
  expect_node_copies(dir, "s2", 4, 2);
  for (const char* name : {"s1", "s2"}) {
    const std::string snap = durable_ + "/" + name;
    const Manifest m = read_manifest(snap);
    EXPECT_EQ(m.world_size, 8);
    std::set<int> writers;
    for (const FileRecord& f : m.files) writers.insert(f.rank);
    EXPECT_EQ(writers.size(), 8u) << "every rank wrote a file";
    EXPECT_TRUE(verify(snap).empty()) << snap;
  }
  for (int n = 0; n < 4; ++n) fs::remove_all(dir / ("node-" + std::to_string(n)));
  expect_all(run_nodes("restore", 3, 1, dir), "ok");
  EXPECT_EQ(compare_whole(load(durable_ + "/s2"), 2), "");
  EXPECT_EQ(compare_whole(load(durable_ + "/s1"), 1), "");
}

// The ranks of one node killed while their shares drain (a rank alone killed leaves its files
// to the node's other ranks): the save is not published; a restart on another world size (4
// ranks, one per node) uploads what is missing and publishes it.
TEST_F(S3Durable, ANodeKilledMidUploadLeavesNothingPublishedAndARestartCompletesIt) {
  TempDir dir;
  ::setenv("TSNAP_TEST_KILL_NODE", "2", 1);
  const Ranks ranks = run_nodes("save", 8, 2, dir);
  for (int r = 0; r < 8; ++r) {
    if (r / 2 == 2) {
      EXPECT_TRUE(WIFSIGNALED(ranks.statuses[r])) << "rank " << r << ": " << ranks.texts[r];
    } else {
      EXPECT_EQ(ranks.texts[r], "ok") << "rank " << r << "\n" << ranks.errs[r];
    }
  }
  // The drain paces each share after sending it: s1 went at once, s2 waits for its turn.
  for (const Listed& l : list(durable_)) {
    if (l.name == "s2") EXPECT_FALSE(l.committed) << "s2 was published without node 2's files";
  }
  ::setenv("TSNAP_TEST_KILL_NODE", "-1", 1);
  expect_all(run_nodes("drain", 4, 1, dir), "ok");
  EXPECT_TRUE(verify(durable_ + "/s2").empty());
  EXPECT_EQ(compare_whole(load(durable_ + "/s2"), 2), "");
  EXPECT_EQ(compare_whole(load(durable_ + "/s1"), 1), "");
}

// Periodic snapshots on 4 nodes, then resume: no node holds a snapshot whole, so every rank
// agrees on the durable copy; with one node's disk gone as well, the same.
TEST_F(S3Durable, ResumeOnNodeLocalRootsAgreesOnTheDurableCopy) {
  TempDir dir;
  expect_all(run_nodes("periodic", 4, 1, dir), "ok");
  expect_all(run_nodes("resume", 4, 1, dir), "resumed 4 equal durable");
  fs::remove_all(dir / "node-2");
  expect_all(run_nodes("resume", 4, 1, dir), "resumed 4 equal durable");
}

// A directory as the durable root, all ranks on one node: the node's copy is whole, so resume
// loads it; with that disk gone, the durable copy.
TEST(NodeLocal, OneNodeResumesFromItsDiskAndFromTheDurableDirectoryWhenTheDiskIsGone) {
  TempDir dir;
  ::setenv("TSNAP_TEST_DURABLE", (dir / "durable").c_str(), 1);
  ::setenv("TSNAP_TEST_RATE", "0", 1);
  expect_all(run_nodes("periodic", 2, 2, dir), "ok");
  EXPECT_TRUE(verify(dir / "durable" / "step-00000004").empty());
  expect_all(run_nodes("resume", 2, 2, dir), "resumed 4 equal local");
  fs::remove_all(dir / "node-0");
  expect_all(run_nodes("resume", 2, 2, dir), "resumed 4 equal durable");
}

// A directory as the durable root on 3 nodes of 2: the ranks copy their shares into one
// temporary directory, the last one commits; one process loads it.
TEST(NodeLocal, SixRanksOnThreeNodesDrainIntoOneDurableDirectory) {
  TempDir dir;
  ::setenv("TSNAP_TEST_DURABLE", (dir / "durable").c_str(), 1);
  ::setenv("TSNAP_TEST_RATE", "0", 1);
  ::setenv("TSNAP_TEST_KILL_NODE", "-1", 1);
  expect_all(run_nodes("save", 6, 2, dir), "ok");
  expect_node_copies(dir, "s2", 3, 2);
  EXPECT_TRUE(verify(dir / "durable" / "s2").empty());
  EXPECT_EQ(compare_whole(load(dir / "durable" / "s2"), 2), "");
  for (const auto& e : fs::directory_iterator(dir / "durable")) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace tsnap
