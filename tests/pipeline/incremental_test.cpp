// Incremental saves (SaveOptions::incremental): chunks equal to the previous snapshot's are not
// written, whole equal files become hard links, and every snapshot of a chain stays complete on
// its own whatever else is deleted.

#include <ATen/ATen.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/test_point.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"
#include "tsnap/hot_snapshot.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/remove.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::make_tensor;
using test_support::TempDir;

constexpr uint64_t kChunk = 64 << 10;  // files of about 4 chunks: 256 KiB

StateDict state_at(int step) { return test_support::fine_tuning_state(step); }

void expect_holds(const fs::path& dir, int step) {
  const StateDict expected = state_at(step);
  const StateDict loaded = load(dir);
  ASSERT_EQ(loaded.size(), expected.size()) << dir;
  for (const auto& [key, entry] : expected) {
    EXPECT_TRUE(bitwise_equal(loaded.at(key), entry.tensor)) << dir << " " << key;
  }
  EXPECT_TRUE(verify(dir).empty()) << dir;
}

SnapshotterOptions options_for(const fs::path& root) {
  SnapshotterOptions o;
  o.root = root;
  o.chunk_bytes = kChunk;
  o.staging.budget_bytes = 64 * kChunk;
  o.incremental = true;
  return o;
}

std::string step_name(int step) { return "s" + std::to_string(step); }

// A chain of 10 incremental snapshots; returns each save's stats.
std::vector<SaveStats> save_chain(Snapshotter& snap) {
  std::vector<SaveStats> stats;
  for (int step = 1; step <= 10; ++step) {
    SaveHandle h = snap.save_async(step_name(step), state_at(step));
    h.wait();
    stats.push_back(h.stats());
  }
  return stats;
}

TEST(Incremental, ChainWritesOnlyWhatChangedAndEveryLinkLoads) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  const std::vector<SaveStats> stats = save_chain(snap);
  EXPECT_EQ(stats[0].linked_bytes, 0u);
  EXPECT_EQ(stats[0].written_bytes, stats[0].bytes);
  for (int step = 2; step <= 10; ++step) {
    const SaveStats& s = stats[step - 1];
    // The backbone (1.2 MB of 1.35) is linked; the head, moments and counter are written.
    EXPECT_GT(s.linked_bytes, 1000000u) << step;
    EXPECT_LT(s.written_bytes, s.bytes / 3) << step;
    EXPECT_EQ(s.written_bytes + s.linked_bytes, s.bytes) << step;
  }
  for (int step = 1; step <= 10; ++step) expect_holds(dir / step_name(step), step);

  // The manifest says which files were reused and from where.
  const Manifest m = read_manifest(dir / "s10");
  EXPECT_EQ(m.format_version, kFormatVersion);
  std::set<std::string> reused;
  for (const FileRecord& f : m.files) {
    if (f.reused_from.empty()) continue;
    reused.insert(f.name);
    EXPECT_EQ(f.reused_from, "s9");
    EXPECT_FALSE(f.tsnap_id.empty());
    struct stat st {};
    ASSERT_EQ(::stat((dir / "s10" / f.name).c_str(), &st), 0);
    EXPECT_GE(st.st_nlink, 2u) << f.name;  // the same inode as s1..s9's file
  }
  EXPECT_GE(reused.size(), 2u);
}

// A fine-tune whose frozen and trained tensors interleave by name ("l0.frozen", "l0.trained",
// "l1.frozen", ...): the first incremental save finds which tensors did not change, the next
// lays those out in files of their own, and from then on each save writes (and takes new disk
// space for) little more than the trained tensors, every snapshot still loading whole.
TEST(Incremental, FrozenTensorsInterleavedByNameEndUpInFilesLaterSavesLink) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  StateDict sd;
  uint64_t trained_bytes = 0;
  for (int l = 0; l < 8; ++l) {
    sd.insert("l" + std::to_string(l) + ".frozen", make_tensor(at::kFloat, {64 << 10}, l));
    sd.insert("l" + std::to_string(l) + ".trained", make_tensor(at::kFloat, {16 << 10}, 100 + l));
    trained_bytes += (16 << 10) * 4;
  }
  std::vector<SaveStats> stats;
  for (int step = 1; step <= 6; ++step) {
    for (int l = 0; l < 8; ++l) sd.at("l" + std::to_string(l) + ".trained").add_(1.0);
    SaveHandle h = snap.save_async(step_name(step), sd);
    h.wait();
    stats.push_back(h.stats());
    const StateDict back = load(dir / step_name(step));
    for (const std::string& key : sd.keys()) {
      ASSERT_TRUE(bitwise_equal(back.at(key), sd.at(key))) << key << " at " << step;
    }
  }
  // Save 1 is whole; save 2 (the first incremental one) lays the frozen tensors out apart, by
  // their samples (plan::sample_hash); from save 3 on, their files are linked.
  for (int step = 3; step <= 6; ++step) {
    const SaveStats& s = stats[static_cast<size_t>(step - 1)];
    // The trained tensors, plus headers and the manifest (a few KiB).
    EXPECT_LE(s.written_bytes, trained_bytes * 11 / 10 + (64u << 10)) << "save " << step;
    EXPECT_GE(s.linked_bytes, 8u * (64 << 10) * 4) << "save " << step;  // every frozen byte
  }
}

TEST(Incremental, DeletingAnySnapshotsLeavesTheOthersWhole) {
  TempDir dir;
  {
    Snapshotter snap(options_for(dir.path()));
    save_chain(snap);
  }
  // Delete a random half, then verify the rest; then all but the newest, then the newest's
  // base chain is gone entirely and it must still load.
  std::mt19937 rng(42);
  std::vector<int> steps{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::shuffle(steps.begin(), steps.end(), rng);
  std::set<int> deleted(steps.begin(), steps.begin() + 5);
  for (int step : deleted) remove_snapshot(dir / step_name(step));
  for (int step = 1; step <= 10; ++step) {
    if (deleted.count(step) == 0) expect_holds(dir / step_name(step), step);
  }
  for (int step = 1; step <= 9; ++step) {
    if (deleted.count(step) == 0) remove_snapshot(dir / step_name(step));
  }
  expect_holds(dir / "s10", 10);

  // A new Snapshotter finds s10 as its base (tsnap::latest) and links to its files.
  Snapshotter snap(options_for(dir.path()));
  SaveHandle h = snap.save_async("s11", state_at(10));
  h.wait();
  EXPECT_EQ(h.stats().written_bytes, h.stats().bytes - h.stats().linked_bytes);
  EXPECT_GT(h.stats().linked_bytes, h.stats().bytes / 2);
  remove_snapshot(dir / "s10");
  expect_holds(dir / "s11", 10);
}

TEST(Incremental, BaseDeletedDuringTheSaveIsCopiedFromItsOpenFiles) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  snap.save_async("s1", state_at(1)).wait();
  SaveOptions lazy;
  lazy.staging = Staging::kLazy;
  const StateDict state = state_at(2);
  SaveHandle h = snap.save_async("s2", state, nlohmann::json::object(), lazy);
  remove_snapshot(dir / "s1");  // before the commit could link to its files
  h.wait();
  expect_holds(dir / "s2", 2);
  EXPECT_FALSE(fs::exists(dir / "s1"));
}

// Saves snapshot `name` of one fp32 tensor "big" of 4 chunks; returns the state it saved.
StateDict save_four_chunks(Snapshotter& snap, const std::string& name) {
  StateDict a;
  a.insert("big", make_tensor(at::kFloat, {static_cast<int64_t>(kChunk)}, 1));
  snap.save_async(name, a).wait();
  return a;
}

TEST(Incremental, AFileWithSomeEqualChunksGetsThemCopiedIn) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  const StateDict a = save_four_chunks(snap, "a");
  StateDict b;
  at::Tensor changed = a.at("big").clone();
  changed[-1] = 12345.0f;  // only the last chunk differs
  b.insert("big", changed);
  SaveHandle h = snap.save_async("b", b);
  h.wait();
  EXPECT_EQ(h.stats().linked_bytes, 0u);
  EXPECT_GE(h.stats().reused_bytes, 2 * kChunk);  // the middle chunks at least
  const StateDict loaded = load(dir / "b");
  EXPECT_TRUE(bitwise_equal(loaded.at("big"), changed));
  EXPECT_TRUE(verify(dir / "b").empty());
  EXPECT_TRUE(bitwise_equal(load(dir / "a").at("big"), a.at("big")));
}

// The file of s<step> that holds `key`, and whether the save reused it whole.
FileRecord file_of(const Manifest& m, const std::string& key) {
  const TensorRecord* t = m.find(key);
  EXPECT_NE(t, nullptr) << key;
  for (const FileRecord& f : m.files) {
    if (f.name == t->file) return f;
  }
  throw std::runtime_error("no file for " + key);
}

// s<step> under `dir` holds its state, and wrote the frozen backbone's file afresh (a base file
// that is not what its manifest says is never reused).
void expect_backbone_written_afresh(const fs::path& dir, int step) {
  expect_holds(dir / step_name(step), step);
  EXPECT_TRUE(
      file_of(read_manifest(dir / step_name(step)), "backbone.layer0.weight").reused_from.empty())
      << "s" << step << " reused the bad file";
}

// Bit rot must not spread: a base chunk is reused only once its bytes are read and proven equal.
TEST(Incremental, ACorruptBaseChunkIsWrittenAfreshNotSpread) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  snap.save_async("s1", state_at(1)).wait();
  const Manifest m1 = read_manifest(dir / "s1");
  const TensorRecord* frozen = m1.find("backbone.layer0.weight");
  ASSERT_NE(frozen, nullptr);
  test_support::flip_byte(dir / "s1" / frozen->file, frozen->begin + 100);
  SaveHandle h = snap.save_async("s2", state_at(2));
  h.wait();
  expect_backbone_written_afresh(dir.path(), 2);
  EXPECT_GT(h.stats().linked_bytes, 0u) << "the intact files are still linked";
  EXPECT_FALSE(verify(dir / "s1").empty()) << "s1 itself stays as it is (corrupt)";
}

TEST(Incremental, ACorruptChunkOfAPartlyEqualFileIsWrittenNotCopied) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  const StateDict a = save_four_chunks(snap, "a");
  const Manifest ma = read_manifest(dir / "a");
  const TensorRecord* t = ma.find("big");
  ASSERT_NE(t, nullptr);
  test_support::flip_byte(dir / "a" / t->file, t->begin + kChunk + 100);  // in chunk 1
  at::Tensor changed = a.at("big").clone();
  changed[-1] = 12345.0f;  // only the last chunk differs
  StateDict b;
  b.insert("big", changed);
  SaveHandle h = snap.save_async("b", b);
  h.wait();
  EXPECT_TRUE(verify(dir / "b").empty());
  EXPECT_TRUE(bitwise_equal(load(dir / "b").at("big"), changed));
  EXPECT_GE(h.stats().reused_bytes, kChunk) << "the intact equal chunks are still copied";
}

TEST(Incremental, ABaseFileSwappedForAnotherSnapshotsIsNotReused) {
  TempDir dir, other;
  // The same layout with other values: files of the same names and sizes.
  auto other_state = [] {
    StateDict sd = state_at(1);
    for (auto& [key, entry] : sd) {
      if (at::isFloatingType(entry.tensor.scalar_type())) sd.set(key, entry.tensor + 1);
    }
    return sd;
  };
  Snapshotter snap(options_for(dir.path()));
  snap.save_async("s1", state_at(1)).wait();
  {
    Snapshotter elsewhere(options_for(other.path()));
    elsewhere.save_async("s1", other_state()).wait();
  }
  const std::string file = file_of(read_manifest(dir / "s1"), "backbone.layer0.weight").name;
  ASSERT_EQ(fs::file_size(dir / "s1" / file), fs::file_size(other / "s1" / file));
  fs::copy_file(other / "s1" / file, dir / "s1" / "swap.tmp");
  fs::rename(dir / "s1" / "swap.tmp", dir / "s1" / file);
  snap.save_async("s2", state_at(2)).wait();
  expect_backbone_written_afresh(dir.path(), 2);
}

TEST(Incremental, ALinkedFileModifiedInPlaceIsNotLinkedAgain) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  snap.save_async("s1", state_at(1)).wait();
  snap.save_async("s2", state_at(2)).wait();
  const FileRecord linked = file_of(read_manifest(dir / "s2"), "backbone.layer0.weight");
  ASSERT_FALSE(linked.reused_from.empty());
  const Manifest m2 = read_manifest(dir / "s2");
  const TensorRecord* t = m2.find("backbone.layer0.weight");
  test_support::flip_byte(dir / "s2" / linked.name, t->begin + 100);  // s1's inode too
  snap.save_async("s3", state_at(3)).wait();
  expect_backbone_written_afresh(dir.path(), 3);
}

TEST(Incremental, OverwritingTheBaseItselfKeepsItsBytes) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  snap.save_async("latest", state_at(1)).wait();
  for (int step = 2; step <= 4; ++step) {
    SaveOptions o;
    o.overwrite = true;
    SaveHandle h = snap.save_async("latest", state_at(step), nlohmann::json::object(), o);
    h.wait();
    EXPECT_GT(h.stats().linked_bytes, 0u);
    expect_holds(dir / "latest", step);
  }
}

// keep_hot: the chunks an incremental save did not write are in its hot image all the same.
TEST(Incremental, HotImageOfAnIncrementalSaveIsWhole) {
  TempDir dir;
  SnapshotterOptions o = options_for(dir.path());
  o.staging.keep_hot = true;
  o.staging.budget_bytes = 0;  // automatic: room for the image and the next save
  Snapshotter snap(o);
  snap.save_async("s1", state_at(1)).wait();
  SaveHandle h = snap.save_async("s2", state_at(2));
  h.wait();
  ASSERT_GT(h.stats().linked_bytes, 0u);
  const HotSnapshot hot = snap.hot_snapshot();
  ASSERT_TRUE(hot);
  const StateDict from_memory = load(hot);
  const StateDict expected = state_at(2);
  ASSERT_EQ(from_memory.size(), expected.size());
  for (const auto& [key, entry] : expected) {
    EXPECT_TRUE(bitwise_equal(from_memory.at(key), entry.tensor)) << key;
  }
}

TEST(Incremental, OffByDefaultAndPerSave) {
  TempDir dir;
  SnapshotterOptions o = options_for(dir.path());
  o.incremental = false;
  Snapshotter snap(o);
  snap.save_async("a", state_at(1)).wait();
  SaveHandle full = snap.save_async("b", state_at(2));
  full.wait();
  EXPECT_EQ(full.stats().written_bytes, full.stats().bytes);
  SaveOptions inc;
  inc.incremental = true;
  snap.save_async("c", state_at(3), nlohmann::json::object(), inc).wait();  // lays out files
  SaveHandle h = snap.save_async("d", state_at(4), nlohmann::json::object(), inc);
  h.wait();
  EXPECT_GT(h.stats().linked_bytes, 0u);
  expect_holds(dir / "d", 4);
}

// What a neighbour process does at one of the library's test points (common/test_point.h),
// for the length of one test.
class AtTestPoint {
 public:
  AtTestPoint(std::string point, std::function<void()> action) {
    std::lock_guard<std::mutex> lock(mu());
    point_ = std::move(point);
    action_ = std::move(action);
    detail::set_test_point_callback([](const char* p) {
      std::lock_guard<std::mutex> lock(mu());
      if (action_ && point_ == p) std::exchange(action_, nullptr)();  // once
    });
  }
  ~AtTestPoint() {
    detail::set_test_point_callback(nullptr);
    std::lock_guard<std::mutex> lock(mu());
    action_ = nullptr;
  }
  bool fired() const {
    std::lock_guard<std::mutex> lock(mu());
    return !action_;
  }

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static inline std::string point_;
  static inline std::function<void()> action_;
};

// Another writer swaps a base file for a different file of the same size between the proof of
// its bytes and the link: the link is made from the proven file's descriptor, so the new
// snapshot holds the proven bytes (a link by path would take the other file).
TEST(Incremental, ABaseFileSwappedJustBeforeTheLinkIsNotTheOneLinked) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  snap.save_async("s1", state_at(1)).wait();
  const std::string file = file_of(read_manifest(dir / "s1"), "backbone.layer0.weight").name;
  const fs::path base = dir / "s1" / file, imposter = dir / "imposter";
  fs::copy_file(base, imposter);
  test_support::flip_byte(imposter, fs::file_size(imposter) - 10);
  AtTestPoint swap("reuse_link", [&] {
    ASSERT_EQ(::renameat2(AT_FDCWD, imposter.c_str(), AT_FDCWD, base.c_str(), RENAME_EXCHANGE), 0);
  });
  SaveHandle h = snap.save_async("s2", state_at(2));
  h.wait();
  EXPECT_TRUE(swap.fired());
  EXPECT_GT(h.stats().linked_bytes, 0u);
  expect_holds(dir / "s2", 2);
}

// The same race, not staged: a writer exchanges a base file with an imposter of the same size
// over and over while incremental saves run; every committed snapshot verifies.
TEST(Incremental, SavesRacingRenamesOfTheirBaseFilesCommitOnlyWhatVerifies) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  snap.save_async("s1", state_at(1)).wait();
  const std::string file = file_of(read_manifest(dir / "s1"), "backbone.layer0.weight").name;
  std::atomic<bool> stop{false};
  std::atomic<int> swaps{0};
  std::atomic<int> base_step{1};
  std::thread neighbour([&] {
    while (!stop) {
      const fs::path base = dir / step_name(base_step) / file;
      const fs::path imposter = dir / ("imposter" + std::to_string(base_step.load()));
      std::error_code ec;
      if (!fs::exists(imposter, ec)) {
        if (!fs::copy_file(base, imposter, ec)) continue;
        test_support::flip_byte(imposter, 4096 + 100);
      }
      if (::renameat2(AT_FDCWD, imposter.c_str(), AT_FDCWD, base.c_str(), RENAME_EXCHANGE) == 0) {
        ++swaps;
      }
    }
  });
  for (int step = 2; step <= 31; ++step) {
    SaveHandle h = snap.save_async(step_name(step), state_at(step));
    try {
      h.wait();
    } catch (const Error& e) {
      // Refused, never committed: a base that changed under the save.
      EXPECT_EQ(e.code(), ErrorCode::kHashMismatch) << e.what();
      EXPECT_FALSE(fs::exists(dir / step_name(step)));
      continue;
    }
    const StateDict loaded = load(dir / step_name(step));  // every chunk verified
    const StateDict expected = state_at(step);
    for (const auto& [key, entry] : expected) {
      ASSERT_TRUE(bitwise_equal(loaded.at(key), entry.tensor)) << step << " " << key;
    }
    base_step = step;
  }
  stop = true;
  neighbour.join();
  EXPECT_GT(swaps.load(), 0);
}

// Another process rewrites a base file in place after its chunks were proven and before they
// are copied: the copied bytes are checked again, so the save fails (naming the base file)
// instead of committing a chunk that fails verify; the base stays as the neighbour left it.
TEST(Incremental, ABaseModifiedInPlaceBeforeItsChunksAreCopiedFailsTheSave) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  const StateDict a = save_four_chunks(snap, "a");
  const Manifest ma = read_manifest(dir / "a");
  const TensorRecord* t = ma.find("big");
  ASSERT_NE(t, nullptr);
  const fs::path base = dir / "a" / t->file;
  AtTestPoint rewrite("reuse_copy", [&] { test_support::flip_byte(base, t->begin + 100); });
  at::Tensor changed = a.at("big").clone();
  changed[-1] = 12345.0f;  // only the last chunk differs: chunks 0-2 are copied
  StateDict b;
  b.insert("big", changed);
  SaveHandle h = snap.save_async("b", b);
  try {
    h.wait();
    ADD_FAILURE() << "a save that copied a changed base chunk committed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kHashMismatch) << e.what();
    EXPECT_NE(std::string(e.what()).find(base.string()), std::string::npos) << e.what();
  }
  EXPECT_TRUE(rewrite.fired());
  EXPECT_FALSE(fs::exists(dir / "b"));
  // The next save proves the base again and writes what changed.
  SaveHandle again = snap.save_async("b", b);
  again.wait();
  EXPECT_TRUE(verify(dir / "b").empty());
  EXPECT_TRUE(bitwise_equal(load(dir / "b").at("big"), changed));
}

// The same for a file linked whole: a link shares the base's inode, so a change in place
// between the proof and the link is caught by reading the linked file back.
TEST(Incremental, ABaseModifiedInPlaceBeforeItIsLinkedFailsTheSave) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  snap.save_async("s1", state_at(1)).wait();
  const Manifest m1 = read_manifest(dir / "s1");
  const FileRecord file = file_of(m1, "backbone.layer0.weight");
  const fs::path base = dir / "s1" / file.name;
  AtTestPoint rewrite("reuse_link", [&] { test_support::flip_byte(base, file.data_offset + 7); });
  SaveHandle h = snap.save_async("s2", state_at(2));
  EXPECT_THROW(h.wait(), FormatError);
  EXPECT_TRUE(rewrite.fired());
  EXPECT_FALSE(fs::exists(dir / "s2"));
}

}  // namespace
}  // namespace tsnap
