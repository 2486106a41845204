// Hot snapshots (SnapshotterOptions::staging.keep_hot): loads from the staging buffers equal loads
// of the directory bit for bit, roll a model and its optimizer back, are verified against the
// manifest's hashes, and never show stale bytes when later saves evict or replace the image.

#include "tsnap/hot_snapshot.h"

#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "io/engine_host.h"
#include "io/fault_engine.h"
#include "stage/hot_image.h"
#include "state/nets.h"
#include "support/on_engine.h"
#include "support/test_util.h"
#include "tsnap/checkpoint.h"
#include "tsnap/dist_group.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::make_tensor;
using test_support::TempDir;

constexpr uint64_t kChunk = 1 << 20;

// `n` fp32 tensors of `elems` elements each (4 * elems bytes).
StateDict floats(int n, int64_t elems, uint64_t seed) {
  StateDict sd;
  for (int i = 0; i < n; ++i) {
    sd.insert("w" + std::to_string(i), make_tensor(at::kFloat, {elems}, seed + i));
  }
  return sd;
}

// Zero tensors shaped and typed like `like` (load_into destinations).
StateDict zeros_like(const StateDict& like, std::optional<at::ScalarType> dtype = {}) {
  StateDict out;
  for (const auto& [k, e] : like) {
    out.insert(k, at::zeros_like(
                      e.tensor, at::TensorOptions().dtype(dtype.value_or(e.tensor.scalar_type()))));
  }
  return out;
}

::testing::AssertionResult same(const StateDict& a, const StateDict& b) {
  if (a.keys() != b.keys()) return ::testing::AssertionFailure() << "different keys";
  for (const auto& [k, e] : a) {
    if (!bitwise_equal(e.tensor, b.at(k))) return ::testing::AssertionFailure() << k << " differs";
  }
  return ::testing::AssertionSuccess();
}

// Whatever the Snapshotter offers as hot is exactly what its directory holds.
void expect_hot_is_disk(const HotSnapshot& hot) {
  ASSERT_TRUE(hot);
  EXPECT_EQ(hot.manifest().id, read_manifest(hot.path()).id);
  EXPECT_TRUE(same(load(hot.path()), load(hot)));
}

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;  // "did not throw"
}

TEST(HotSnapshot, NoneWithoutKeepHot) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(), .chunk_bytes = kChunk});
  EXPECT_FALSE(snap.hot_snapshot());
  snap.save_async("a", floats(2, 1000, 1)).wait();
  const HotSnapshot none = snap.hot_snapshot();
  EXPECT_FALSE(none);
  EXPECT_FALSE(none.resident());
  StateDict dest;
  EXPECT_EQ(code_of([&] { load(none); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { load_into(none, dest); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { (void)none.manifest(); }), ErrorCode::kInvalidArgument);
}

// With a group (here of one process) keep_hot works; tests/dist covers several ranks.
TEST(HotSnapshot, WorksWithADistributedGroup) {
  TempDir dir;
  auto group = std::make_shared<DistGroup>(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = kChunk, .staging = {.keep_hot = true}, .group = group});
  const StateDict sd = floats(3, 5000, 4);
  snap.save_async("a", sd).wait();
  const HotSnapshot hot = snap.hot_snapshot();
  ASSERT_TRUE(hot);
  const StateDict back = load(hot);
  for (const auto& [key, e] : sd) EXPECT_TRUE(bitwise_equal(back.at(key), e.tensor)) << key;
}

TEST(HotSnapshot, NoneBeforeTheFirstCommit) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(), .chunk_bytes = kChunk, .staging = {.keep_hot = true}});
  EXPECT_FALSE(snap.hot_snapshot());
}

// fp32 and bf16 stored, every dtype and awkward shape, several chunks and shards: load and
// load_into (same dtype, and bf16 -> fp32 upcast) from memory equal the same from disk.
TEST(HotSnapshot, EqualsDiskRestoreBitwise) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(), .chunk_bytes = kChunk, .staging = {.keep_hot = true}});
  StateDict state = test_support::mixed_state(3);
  for (auto& [k, e] : floats(3, 700000, 10)) state.insert(k, e.tensor);  // 8 MiB, many chunks
  for (const std::optional<at::ScalarType> stored :
       {std::optional<at::ScalarType>(), std::optional<at::ScalarType>(at::kBFloat16)}) {
    const std::string name = stored ? "bf16" : "fp32";
    SCOPED_TRACE(name);
    snap.save_async(name, state, {{"step", 7}}, {.dtype = stored, .num_shards = 2}).wait();
    const HotSnapshot hot = snap.hot_snapshot();
    ASSERT_TRUE(hot);
    EXPECT_EQ(hot.name(), name);
    EXPECT_EQ(hot.path(), dir / name);
    EXPECT_TRUE(hot.resident());
    EXPECT_EQ(hot.manifest().metadata["step"], 7);
    EXPECT_EQ(hot.manifest().files.size(), 2u);
    expect_hot_is_disk(hot);

    StateDict from_disk = zeros_like(state), from_hot = zeros_like(state);
    load_into(dir / name, from_disk);
    const LoadReport report = load_into(hot, from_hot);
    EXPECT_TRUE(same(from_disk, from_hot));
    EXPECT_EQ(report.engine, "memory");
    EXPECT_EQ(report.loaded, from_hot.keys());
    EXPECT_GT(report.bytes_read, 0u);
    if (!stored) EXPECT_TRUE(same(state, from_hot));

    // Only the floating tensors, into fp32 destinations (bf16 upcast), atomically.
    StateDict fp32_disk, fp32_hot;
    for (const auto& [k, e] : state) {
      if (k.rfind("w", 0) == 0) {
        fp32_disk.insert(k, at::zeros_like(e.tensor));
        fp32_hot.insert(k, at::zeros_like(e.tensor));
      }
    }
    load_into(dir / name, fp32_disk, {.atomic = true});
    load_into(hot, fp32_hot, {.atomic = true, .read_budget_bytes = 4096});  // no buffers needed
    EXPECT_TRUE(same(fp32_disk, fp32_hot));

    // Selections and prefixes work as on disk.
    const LoadOptions some{.include = {"w*", "odd.*"}};
    EXPECT_TRUE(same(load(dir / name, some), load(hot, some)));
    EXPECT_TRUE(same(load(dir / name, {.key_prefix = "odd."}), load(hot, {.key_prefix = "odd."})));
    EXPECT_TRUE(same(load(dir / name, {.verify = false}), load(hot, {.verify = false})));
  }
}

TEST(HotSnapshot, ErrorsAreThoseOfTheDiskLoad) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(), .chunk_bytes = kChunk, .staging = {.keep_hot = true}});
  const StateDict state = floats(2, 1000, 1);
  snap.save_async("a", state).wait();
  const HotSnapshot hot = snap.hot_snapshot();
  StateDict missing = zeros_like(state);
  missing.insert("nope", at::zeros({3}));
  EXPECT_EQ(code_of([&] { load_into(hot, missing); }), ErrorCode::kKeyNotFound);
  StateDict wrong;
  wrong.insert("w0", at::zeros({999}));
  EXPECT_EQ(code_of([&] { load_into(hot, wrong); }), ErrorCode::kShapeMismatch);
  EXPECT_EQ(code_of([&] { load(hot, {.include = {"typo*"}}); }), ErrorCode::kKeyNotFound);
}

// A buffer corrupted in memory fails its chunk's hash like a corrupt file does; an atomic load
// then writes nothing, and the disk copy is unaffected.
TEST(HotSnapshot, CorruptBufferIsAHashMismatch) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(), .chunk_bytes = kChunk, .staging = {.keep_hot = true}});
  const StateDict state = floats(3, 600000, 5);  // 7 MiB: several chunks
  snap.save_async("a", state).wait();
  const HotSnapshot hot = snap.hot_snapshot();
  {
    const std::shared_ptr<stage::HotImage> image = detail::HotAccess::pin(hot);
    image->chunk_for_test(hot.manifest().files[0], 1)[123] ^= 0x40;
  }
  try {
    load(hot);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kHashMismatch);
    EXPECT_NE(std::string(e.what()).find("chunk 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in memory"), std::string::npos) << e.what();
  }
  StateDict dest = zeros_like(state);
  EXPECT_EQ(code_of([&] { load_into(hot, dest, {.atomic = true}); }), ErrorCode::kHashMismatch);
  EXPECT_TRUE(same(zeros_like(state), dest));  // atomic: nothing written
  EXPECT_EQ(code_of([&] { load_into(hot, dest); }), ErrorCode::kHashMismatch);
  // Unverified, the corrupt byte goes through (as it would from a corrupt file).
  EXPECT_FALSE(same(state, load(hot, {.verify = false})));
  EXPECT_TRUE(same(state, load(dir / "a")));
}

// Training runs on, a "NaN" comes; the hot checkpoint rolls model and optimizer back exactly
// as the disk checkpoint does, and training from there is identical.
TEST(HotSnapshot, RollsModelAndOptimizerBackThroughACheckpoint) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(), .staging = {.keep_hot = true}});
  namespace optim = torch::optim;
  using test_support::Net;
  auto objects = [](Net& net, optim::Optimizer& opt) -> Checkpoint::Objects {
    return {{"model", net}, {"optim", tsnap::bind(opt, net)}, {"rng", rng_state()}};
  };
  at::manual_seed(0);
  Net net;
  optim::Adam opt(net->parameters(), optim::AdamOptions(0.01));
  test_support::train(net, opt, 3);
  snap.save_async("step3", Checkpoint::of(objects(net, opt), {{"step", 3}})).wait();
  test_support::train(net, opt, 4);  // ... and the loss goes NaN: roll back

  const HotSnapshot hot = snap.hot_snapshot();
  ASSERT_TRUE(hot);
  const Checkpoint from_hot = load_checkpoint(hot);
  EXPECT_EQ(from_hot.metadata()["step"], 3);
  ASSERT_TRUE(from_hot.apply(objects(net, opt)).ok());
  test_support::train(net, opt, 2);

  at::manual_seed(42);
  Net ref;
  optim::Adam ref_opt(ref->parameters(), optim::AdamOptions(0.5));
  ASSERT_TRUE(load_checkpoint(dir / "step3").apply(objects(ref, ref_opt)).ok());
  test_support::train(ref, ref_opt, 2);
  EXPECT_TRUE(test_support::same_tensors(*net, *ref));
}

// With a budget for one snapshot and a bit, the next save evicts the hot image: the old handle
// then reports it gone, and the Snapshotter offers the new one or none, never stale bytes.
TEST(HotSnapshot, LaterSaveEvictsUnderASmallBudget) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(),
                    .chunk_bytes = kChunk,
                    .staging = {.budget_bytes = 5 * kChunk, .keep_hot = true}});
  snap.save_async("a", floats(3, kChunk / 4, 1)).wait();  // 3 chunks + header
  const HotSnapshot a = snap.hot_snapshot();
  ASSERT_TRUE(a);
  EXPECT_EQ(a.name(), "a");
  expect_hot_is_disk(a);

  snap.save_async("b", floats(3, kChunk / 4, 2)).wait();  // needs the buffers a holds
  EXPECT_FALSE(a.resident());
  EXPECT_EQ(code_of([&] { load(a); }), ErrorCode::kNotFound);
  EXPECT_EQ(a.name(), "a");  // the handle still describes it
  const HotSnapshot b = snap.hot_snapshot();
  ASSERT_TRUE(b);  // 4 of 5 buffers once a's are back
  EXPECT_EQ(b.name(), "b");
  expect_hot_is_disk(b);

  // Larger than the whole pool: it cannot keep itself, and b is evicted.
  snap.save_async("c", floats(8, kChunk / 4, 3)).wait();
  EXPECT_FALSE(b.resident());
  EXPECT_FALSE(snap.hot_snapshot());

  // And afterwards a save that fits is kept again.
  snap.save_async("d", floats(2, kChunk / 4, 4)).wait();
  ASSERT_TRUE(snap.hot_snapshot());
  EXPECT_EQ(snap.hot_snapshot().name(), "d");
  expect_hot_is_disk(snap.hot_snapshot());
}

// The automatic budget holds two snapshots: the image survives the next save's staging and is
// replaced by it when it commits. Many saves in flight at once never leave a stale image.
TEST(HotSnapshot, NewerSaveReplacesItAndAutomaticBudgetHoldsTwo) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(), .chunk_bytes = kChunk, .staging = {.keep_hot = true}});
  snap.save_async("a", floats(4, kChunk / 4, 1)).wait();
  EXPECT_GE(snap.staging_budget_bytes(), 2 * 4 * kChunk);
  const HotSnapshot a = snap.hot_snapshot();
  SaveHandle h = snap.save_async("b", floats(4, kChunk / 4, 2));
  h.wait();
  EXPECT_FALSE(a.resident());
  EXPECT_EQ(snap.hot_snapshot().name(), "b");
  expect_hot_is_disk(snap.hot_snapshot());

  std::vector<SaveHandle> handles;
  for (int i = 0; i < 6; ++i) {
    handles.push_back(snap.save_async("m" + std::to_string(i), floats(4, kChunk / 4, 10 + i)));
  }
  for (SaveHandle& x : handles) x.wait();
  const HotSnapshot last = snap.hot_snapshot();
  if (last) {
    EXPECT_EQ(last.name(), "m5");
    expect_hot_is_disk(last);
  }
  // Overwriting the hot snapshot's name: the image follows the new contents.
  snap.save_async("m5", floats(4, kChunk / 4, 99), nlohmann::json::object(), {.overwrite = true})
      .wait();
  ASSERT_TRUE(snap.hot_snapshot());
  EXPECT_TRUE(same(floats(4, kChunk / 4, 99), load(snap.hot_snapshot())));
  expect_hot_is_disk(snap.hot_snapshot());
}

// A failed save keeps no image and leaves the previous one in place.
TEST(HotSnapshot, FailedSaveKeepsThePreviousImage) {
  TempDir dir;
  io::Faults faults;
  faults.fail_write = 5;  // the first save writes 2 chunks, the second fails on its third
  auto faulty = std::make_shared<io::FaultInjectingEngine>(io::make_pwrite_engine(2), faults);
  Snapshotter snap = test_support::on_engine(faulty, [&] {
    return Snapshotter({.root = dir.path(),
                        .chunk_bytes = kChunk,
                        .staging = {.budget_bytes = 8 * kChunk, .keep_hot = true}});
  });
  snap.save_async("a", floats(1, kChunk / 4, 1)).wait();  // header + data: 2 chunks
  ASSERT_TRUE(snap.hot_snapshot());
  EXPECT_THROW(snap.save_async("b", floats(3, kChunk / 4, 2)).wait(), Error);
  ASSERT_TRUE(snap.hot_snapshot());
  EXPECT_EQ(snap.hot_snapshot().name(), "a");
  expect_hot_is_disk(snap.hot_snapshot());
  // Its kept buffers went back: a save of the whole pool's worth (less a's) still fits.
  snap.save_async("c", floats(5, kChunk / 4, 3)).wait();
  EXPECT_EQ(snap.hot_snapshot().name(), "c");
}

// A load pins the image it reads, and a save that runs meanwhile never takes the pinned
// buffers: with room for both it replaces the image; with a little room it gives up keeping
// its own image and completes; with none (the pinned image holds every buffer) it waits for
// the load. Every load returns the old snapshot exactly; no state ever offers stale bytes.
TEST(HotSnapshot, LoadPinsTheImageWhileANewSaveRuns) {
  // The snapshots are 3 MiB + a header: 4 chunks.
  for (const uint64_t buffers : {16, 5, 4}) {
    SCOPED_TRACE(buffers);
    TempDir dir;
    Snapshotter snap({.root = dir.path(),
                      .chunk_bytes = kChunk,
                      .staging = {.budget_bytes = buffers * kChunk, .keep_hot = true}});
    const StateDict old_state = floats(3, kChunk / 4, 1);
    snap.save_async("old", old_state).wait();
    const HotSnapshot old_hot = snap.hot_snapshot();
    ASSERT_TRUE(old_hot);

    std::mutex mu;
    std::condition_variable cv;
    bool in_load = false, release = false;
    LoadOptions held;
    held.progress = [&](const Progress&) {
      std::unique_lock<std::mutex> lock(mu);
      if (!in_load) {
        in_load = true;
        cv.notify_all();
        cv.wait(lock, [&] { return release; });
      }
    };
    StateDict dest = zeros_like(old_state);
    auto reader = std::async(std::launch::async, [&] { return load_into(old_hot, dest, held); });
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return in_load; });
    }
    std::atomic<bool> saved{false};
    const StateDict new_state = floats(3, kChunk / 4, 2);
    auto writer = std::async(std::launch::async, [&] {
      snap.save_async("new", new_state).wait();
      saved = true;
    });
    if (buffers > 4) {
      writer.wait();  // completes while the old image is pinned
      EXPECT_TRUE(saved);
      const HotSnapshot now = snap.hot_snapshot();
      EXPECT_EQ(static_cast<bool>(now), buffers >= 8);
      if (now) EXPECT_EQ(now.name(), "new");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_FALSE(saved);  // every buffer is pinned: it waits for the load
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      release = true;
    }
    cv.notify_all();
    reader.get();
    EXPECT_TRUE(same(old_state, dest));
    writer.get();
    EXPECT_FALSE(old_hot.resident());  // evicted or replaced, once no load pins it
    EXPECT_TRUE(same(new_state, load(dir / "new")));
    if (const HotSnapshot now = snap.hot_snapshot()) {
      EXPECT_EQ(now.name(), "new");
      expect_hot_is_disk(now);
    }
  }
}

TEST(HotSnapshot, HandleOutlivesTheSnapshotter) {
  TempDir dir;
  HotSnapshot hot;
  {
    Snapshotter snap({.root = dir.path(), .chunk_bytes = kChunk, .staging = {.keep_hot = true}});
    snap.save_async("a", floats(1, 1000, 1)).wait();
    hot = snap.hot_snapshot();
    EXPECT_TRUE(hot.resident());
  }
  EXPECT_FALSE(hot.resident());
  EXPECT_EQ(hot.manifest().tensors.size(), 1u);
  EXPECT_EQ(code_of([&] { load(hot); }), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace tsnap
