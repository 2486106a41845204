// The two-tier Snapshotter (SnapshotterOptions::tier.durable_root) and its drain: bitwise copies,
// the rate limit, a corrupt local chunk, local_keep_last, latest() across tiers, overwrite,
// resuming an interrupted drain, stale durable temporaries.

#include "pipeline/drain.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "format/layout.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/remove.h"
#include "tsnap/save.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::dir_entries;
using test_support::make_tensor;
using test_support::TempDir;

StateDict state(uint64_t seed, int n = 3, int64_t elems = 1 << 18) {
  StateDict sd;
  for (int i = 0; i < n; ++i) {
    sd.insert("w" + std::to_string(i), make_tensor(at::kFloat, {elems}, seed + i));
  }
  return sd;
}

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every file of the two snapshot directories, byte for byte.
void expect_same_tree(const fs::path& a, const fs::path& b) {
  ASSERT_EQ(dir_entries(a), dir_entries(b));
  for (const std::string& name : dir_entries(a)) {
    EXPECT_TRUE(bytes_of(a / name) == bytes_of(b / name)) << name;
  }
}

void expect_equal(const StateDict& want, const StateDict& got) {
  ASSERT_EQ(want.keys(), got.keys());
  for (const auto& [k, e] : want) EXPECT_TRUE(bitwise_equal(e.tensor, got.at(k))) << k;
}

struct Tiers {
  TempDir local, durable;
  SnapshotterOptions options(int keep = 0, uint64_t rate = 0) const {
    SnapshotterOptions o;
    o.root = local.path();
    o.staging.budget_bytes = 8 << 20;
    o.chunk_bytes = 1 << 20;
    o.tier.durable_root = durable.path();
    o.tier.bytes_per_second = rate;
    o.tier.local_keep_last = keep;
    return o;
  }
};

TEST(Drain, CopiesEverySnapshotBitwise) {
  Tiers t;
  Snapshotter snap(t.options());
  std::vector<DrainRecord> records;
  std::mutex mu;
  snap.add_drain_listener([&](const DrainRecord& r) {
    std::lock_guard<std::mutex> lock(mu);
    records.push_back(r);
  });
  snap.save_async("a", state(1), {{"step", 1}}).wait();
  snap.save_async("b", state(2), {{"step", 2}}, {.num_shards = 3}).wait();
  snap.drain_wait();
  for (const char* name : {"a", "b"}) {
    expect_same_tree(t.local / name, t.durable / name);
    EXPECT_TRUE(verify(t.durable / name).empty()) << name;
    EXPECT_TRUE(snap.drained(name)) << name;
  }
  EXPECT_FALSE(snap.drained("nope"));
  const DrainStats s = snap.drain_stats();
  EXPECT_EQ(s.drained, 2);
  EXPECT_EQ(s.failed, 0);
  uint64_t want = 0;
  for (const char* name : {"a", "b"}) {
    for (const std::string& f : dir_entries(t.local / name))
      want += fs::file_size(t.local / name / f);
  }
  EXPECT_EQ(s.bytes, want);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].name, "a");  // oldest first
  EXPECT_EQ(records[1].name, "b");
  EXPECT_TRUE(records[0].ok && records[1].ok);
  // Nothing but the two snapshots under the durable root (no temporaries).
  EXPECT_EQ(dir_entries(t.durable.path()), (std::vector<std::string>{"a", "b"}));
}

TEST(Drain, RateLimitPacesTheCopy) {
  Tiers t;
  const uint64_t rate = 8 << 20;  // 8 MiB/s for ~6 MiB of shards: at least ~0.6 s
  Snapshotter snap(t.options(0, rate));
  snap.save_async("a", state(3, 2, 3 << 18), {}).wait();  // 2 x 3 MiB
  snap.drain_wait();
  const DrainStats s = snap.drain_stats();
  ASSERT_EQ(s.drained, 1);
  uint64_t shard_bytes = 0;
  for (const std::string& f : dir_entries(t.local / "a")) {
    if (f != kManifestName) shard_bytes += fs::file_size(t.local / "a" / f);
  }
  // Pacing starts each 1 MiB piece no earlier than its share of the rate allows, so the last
  // piece starts at least (bytes - 1 MiB) / rate after the first: a lower bound only.
  EXPECT_GE(s.seconds, static_cast<double>(shard_bytes - (1 << 20)) / rate * 0.99);
  expect_same_tree(t.local / "a", t.durable / "a");
}

TEST(Drain, CorruptLocalChunkFailsAndLeavesNoDurableSnapshot) {
  Tiers t;
  save(t.local / "good", state(4), {{"step", 1}});
  save(t.local / "bad", state(5), {{"step", 2}}, {.chunk_bytes = 1 << 20});
  const Manifest m = read_manifest(t.local / "bad");
  const FileRecord& f = m.files.at(0);
  ASSERT_GE(f.chunk_hashes.size(), 3u);
  test_support::flip_byte(t.local / "bad" / f.name, 2 * f.chunk_bytes + 100);  // chunk 2

  Snapshotter snap(t.options(1));  // keep_last 1: still never removes the undrained "bad"
  try {
    snap.drain_wait();
    FAIL() << "the corrupt chunk was not reported";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kHashMismatch);
    const std::string what = e.what();
    EXPECT_NE(what.find(f.name), std::string::npos) << what;
    EXPECT_NE(what.find("chunk 2"), std::string::npos) << what;
  }
  EXPECT_EQ(dir_entries(t.durable.path()), std::vector<std::string>{"good"});
  EXPECT_FALSE(snap.drained("bad"));
  // "good" drained and is beyond local_keep_last: removed locally; "bad" is not drained: kept.
  EXPECT_EQ(dir_entries(t.local.path()), std::vector<std::string>{"bad"});
  EXPECT_EQ(snap.drain_stats().failed, 1);
  EXPECT_NO_THROW(snap.drain_wait());  // reported once; bad local bytes are not retried
  EXPECT_EQ(snap.drain_stats().failed, 1);
  // A newer save drains; the undrained "bad" still stays local beyond local_keep_last.
  snap.save_async("c", state(6), {{"step", 3}}).wait();
  snap.drain_wait();
  EXPECT_EQ(dir_entries(t.local.path()), (std::vector<std::string>{"bad", "c"}));
  EXPECT_EQ(dir_entries(t.durable.path()), (std::vector<std::string>{"c", "good"}));
}

TEST(Drain, LocalKeepLastRemovesOnlyDrainedSnapshots) {
  Tiers t;
  Snapshotter snap(t.options(2));
  for (int step = 1; step <= 4; ++step) {
    snap.save_async(format::step_name(step), state(10 + step), {{"step", step}}).wait();
  }
  snap.drain_wait();
  EXPECT_EQ(dir_entries(t.local.path()),
            (std::vector<std::string>{format::step_name(3), format::step_name(4)}));
  EXPECT_EQ(dir_entries(t.durable.path()).size(), 4u);
  for (const std::string& name : dir_entries(t.durable.path())) {
    EXPECT_TRUE(verify(t.durable / name).empty()) << name;
  }
  // Removed locally by retention: still counted as drained, not copied again, and drained()
  // says so (a loop waiting on it ends).
  EXPECT_EQ(snap.drain_stats().drained, 4);
  for (int step = 1; step <= 4; ++step) EXPECT_TRUE(snap.drained(format::step_name(step))) << step;
  EXPECT_FALSE(snap.drained(format::step_name(5)));
}

TEST(Drain, LatestLooksAtBothTiers) {
  Tiers t;
  Snapshotter snap(t.options(0));
  snap.save_async("step-1", state(20), {{"step", 1}}).wait();
  snap.drain_wait();
  EXPECT_EQ(*snap.latest(), t.local / "step-1");  // a tie: the local one
  save(t.durable / "step-9", state(21), {{"step", 9}});
  EXPECT_EQ(*snap.latest(), t.durable / "step-9");
  remove_snapshot(t.durable / "step-9");
  remove_snapshot(t.local / "step-1");
  EXPECT_EQ(*snap.latest(), t.durable / "step-1");  // the local disk lost it
}

TEST(Drain, OverwriteReplacesTheDurableSnapshot) {
  Tiers t;
  Snapshotter snap(t.options(0));
  snap.save_async("latest", state(30), {{"step", 1}}).wait();
  snap.drain_wait();
  const StateDict second = state(31);
  snap.save_async("latest", second, {{"step", 2}}, {.overwrite = true}).wait();
  snap.drain_wait();
  expect_same_tree(t.local / "latest", t.durable / "latest");
  expect_equal(second, load(t.durable / "latest"));
  EXPECT_EQ(read_manifest(t.durable / "latest").metadata.at("step"), 2);
  EXPECT_EQ(dir_entries(t.durable.path()), std::vector<std::string>{"latest"});
}

TEST(Drain, StartDrainsWhatTheDurableTierLacksAndRemovesStaleTemporaries) {
  Tiers t;
  {
    SnapshotterOptions o = t.options();
    o.tier.durable_root.clear();  // a run without the tier, or one killed before its drain
    Snapshotter snap(o);
    for (int step = 1; step <= 3; ++step) {
      snap.save_async(format::step_name(step), state(40 + step), {{"step", step}}).wait();
    }
  }
  const std::string stale = "." + format::step_name(1) + ".tmp-" + format::new_save_id();
  fs::create_directories(t.durable / stale);
  std::ofstream(t.durable / stale / "half.safetensors") << "partial";
  Snapshotter snap(t.options(0));
  snap.drain_wait();
  EXPECT_EQ(
      dir_entries(t.durable.path()),
      (std::vector<std::string>{format::step_name(1), format::step_name(2), format::step_name(3)}));
  for (int step = 1; step <= 3; ++step) {
    expect_same_tree(t.local / format::step_name(step), t.durable / format::step_name(step));
  }
}

TEST(Drain, DestructionStopsACopyAndTheNextSnapshotterFinishesIt) {
  Tiers t;
  {
    Snapshotter snap(t.options(0, 1 << 20));  // 1 MiB/s: several seconds for this one
    snap.save_async("slow", state(50, 4, 1 << 18), {{"step", 1}}).wait();
  }  // destroyed while copying
  for (const std::string& name : dir_entries(t.durable.path())) {
    EXPECT_NE(name, "slow") << "the copy cannot have finished";
    EXPECT_FALSE(fs::exists(t.durable / name / kManifestName)) << name;
  }
  Snapshotter snap(t.options(0));
  snap.drain_wait();
  EXPECT_EQ(dir_entries(t.durable.path()), std::vector<std::string>{"slow"});
  expect_same_tree(t.local / "slow", t.durable / "slow");
}

TEST(Drain, RefusesTheRootAsDurableRoot) {
  Tiers t;
  SnapshotterOptions o = t.options();
  o.tier.durable_root = t.local.path();
  EXPECT_THROW(Snapshotter{o}, InvalidArgument);
  o = t.options();
  o.tier.local_keep_last = -1;
  EXPECT_THROW(Snapshotter{o}, InvalidArgument);
}

TEST(Drain, WithoutATierNothingDrains) {
  TempDir dir;
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = 1 << 20, .staging = {.budget_bytes = 8 << 20}});
  snap.save_async("a", state(60), {}).wait();
  EXPECT_NO_THROW(snap.drain_wait());
  EXPECT_FALSE(snap.drained("a"));
  EXPECT_TRUE(snap.durable_root().empty());
  EXPECT_EQ(snap.drain_stats().drained, 0);
}

}  // namespace
}  // namespace tsnap
