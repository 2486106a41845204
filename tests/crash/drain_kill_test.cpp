// Crash test of the durable tier's drain (label `crash`): a child process saves snapshots to a
// local root with a slow drain to a durable root and is killed with SIGKILL at a random moment.
// After each kill, every directory of the durable root that looks committed (a MANIFEST.json
// under a name that is not a temporary) must verify completely and equal the local snapshot of
// the same save, and a new Snapshotter on the same roots must finish the drain.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "crash/child_process.h"
#include "format/layout.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/load.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::make_tensor;
using test_support::TempDir;

StateDict state(uint64_t seed) {
  StateDict sd;
  for (int i = 0; i < 4; ++i) {
    sd.insert("w" + std::to_string(i), make_tensor(at::kFloat, {1 << 18}, seed * 16 + i));
  }
  return sd;
}

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The child: saves every 50 ms (new names, and overwrites of "latest") while the drain copies
// at 16 MiB/s (a 4 MiB snapshot takes ~0.25 s), until it is killed.
TEST(DrainCrash, ChildProcess) {
  const char* local = std::getenv("TSNAP_DRAIN_LOCAL");
  const char* durable = std::getenv("TSNAP_DRAIN_DURABLE");
  if (local == nullptr || durable == nullptr) {
    GTEST_SKIP() << "runs only as the child of DrainCrash.Killed...";
  }
  try {
    SnapshotterOptions o;
    o.root = local;
    o.staging.budget_bytes = 8 << 20;
    o.chunk_bytes = 1 << 20;
    o.tier.durable_root = durable;
    o.tier.bytes_per_second = 16 << 20;
    o.tier.local_keep_last = 2;
    Snapshotter snap(o);
    for (int step = 1;; ++step) {
      snap.save_async(format::step_name(step), state(step), {{"step", step}}).wait();
      snap.save_async("latest", state(step + 1000), {{"step", step}}, {.overwrite = true}).wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (...) {
  }
  _exit(3);
}

// Every committed-looking durable snapshot verifies and equals its local save, if still local.
void check_durable(const fs::path& local, const fs::path& durable, int* committed) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(durable)) {
    const std::string name = e.path().filename().string();
    if (format::looks_temporary(name) || !fs::exists(e.path() / kManifestName, ec)) continue;
    ++*committed;
    Manifest m;
    ASSERT_NO_THROW(m = read_manifest(e.path())) << name;
    EXPECT_TRUE(verify(e.path()).empty()) << name;
    if (!fs::exists(local / name / kManifestName, ec)) continue;
    Manifest here;
    try {
      here = read_manifest(local / name);
    } catch (const Error&) {
      continue;
    }
    if (here.id != m.id) continue;  // overwritten locally since: the next drain replaces it
    for (const fs::directory_entry& f : fs::directory_iterator(e.path())) {
      const std::string file = f.path().filename().string();
      EXPECT_TRUE(bytes_of(f.path()) == bytes_of(local / name / file)) << name << "/" << file;
    }
  }
}

TEST(DrainCrash, KilledDrainNeverLeavesABadDurableSnapshot) {
  std::mt19937 rng(4242);
  int durable_seen = 0, temporaries_seen = 0;
  for (int round = 0; round < 16; ++round) {
    TempDir local, durable;
    const pid_t pid = crash_test::spawn_self("DrainCrash.ChildProcess",
                                             {{"TSNAP_DRAIN_LOCAL", local.path().string()},
                                              {"TSNAP_DRAIN_DURABLE", durable.path().string()}});
    ASSERT_GE(pid, 0);
    // LibTorch takes a second or more to load in the child (longer on a loaded machine); the
    // kill comes at a random moment after its first local commit, while it saves and drains.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::error_code ec;
    while (!fs::exists(local / format::step_name(1) / kManifestName, ec) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 1600));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child ended on its own: " << status;

    int committed = 0;
    check_durable(local.path(), durable.path(), &committed);
    durable_seen += committed;
    for (const fs::directory_entry& e : fs::directory_iterator(durable.path())) {
      temporaries_seen += format::looks_temporary(e.path().filename().string());
    }

    // A new Snapshotter on the same roots finishes the drain: every committed local save is
    // then durable, and no temporary is left.
    SnapshotterOptions o;
    o.root = local.path();
    o.staging.budget_bytes = 8 << 20;
    o.chunk_bytes = 1 << 20;
    o.tier.durable_root = durable.path();
    o.tier.local_keep_last = 0;
    Snapshotter snap(o);
    snap.drain_wait();
    for (const Listed& l : list(local.path())) {
      if (!l.committed) continue;
      EXPECT_TRUE(snap.drained(l.name)) << l.name;
      Manifest there;
      ASSERT_NO_THROW(there = read_manifest(durable / l.name)) << l.name;
      EXPECT_EQ(there.id, l.manifest->id) << l.name;
    }
    for (const Listed& l : list(durable.path())) {
      EXPECT_TRUE(l.committed) << l.name << ": " << l.problem;
    }
    committed = 0;
    check_durable(local.path(), durable.path(), &committed);
    EXPECT_GE(committed, 1);
  }
  // The kills came while the drain had committed something at least once.
  EXPECT_GT(durable_seen, 0);
  std::printf(
      "drain crash: %d committed durable snapshots checked after kills, %d copies "
      "killed midway (temporaries)\n",
      durable_seen, temporaries_seen);
}

}  // namespace
}  // namespace tsnap
