// The CUDA paths (label `cuda`; every test skips without a CUDA device). Saves: device tensors
// are converted on the device, copied to pinned staging buffers with non-blocking copies on a
// side stream, and the snapshot holds the values as of save_async (eager) / wait_staged (lazy).
// Loads: load_into device destinations reads and verifies into pinned host stand-ins, then
// copies them on a side stream ordered after the caller's stream; the results are bitwise those
// of the same load into CPU tensors, and a failed load leaves the device tensors unwritten.

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "restore/restore_util.h"
#include "stage/staging_pool.h"
#include "support/test_util.h"
#include "tsnap/hot_snapshot.h"
#include "tsnap/load.h"
#include "tsnap/save.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::error_of;
using test_support::has;
using test_support::make_tensor;
using test_support::TempDir;

// `sd` with every tensor filled with `value`, on the CUDA device.
StateDict filled_on_cuda(const StateDict& sd, double value) {
  StateDict out;
  for (const auto& [k, e] : sd) {
    out.insert(k, at::full_like(e.tensor, value, e.tensor.options().device(at::kCUDA)), {},
               e.shard);
  }
  return out;
}

// Every tensor of `a` is bitwise equal to the same key's in `b` (wherever each lives).
void expect_same(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& [k, e] : a) EXPECT_TRUE(bitwise_equal(e.tensor, b.at(k))) << k;
}

class CudaStaging : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  }
  at::TensorOptions cuda(at::ScalarType t = at::kFloat) {
    return at::TensorOptions().device(at::kCUDA).dtype(t);
  }
};

TEST_F(CudaStaging, PoolIsPinned) {
  stage::StagingPool pool(2, 1 << 20, /*pinned=*/true);
  EXPECT_TRUE(pool.pinned());
  EXPECT_TRUE(at::detail::getCUDAHooks().isPinnedPtr(pool.data(0)));
}

TEST_F(CudaStaging, EagerSaveOfDeviceTensorsIsExact) {
  TempDir dir;
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = 4 << 20, .staging = {.budget_bytes = 16 << 20}});
  at::manual_seed(1);
  at::Tensor a = at::randn({3, 1000, 1000}, cuda());  // 12 MB: several chunks
  at::Tensor t = at::randn({300, 500}, cuda()).t();   // non-contiguous
  at::Tensor i = at::randint(0, 1000, {12345}, cuda(at::kLong));
  at::Tensor h = at::randn({777}, cuda(at::kHalf));
  StateDict sd{{"a", a}, {"t", t}, {"i", i}, {"h", h}};
  const at::Tensor ra = a.cpu(), rt = t.contiguous().cpu(), ri = i.cpu(), rh = h.cpu();
  SaveHandle handle = snap.save_async("f32", sd);
  // Training moves on at once, on the device's current stream.
  a.mul_(-2);
  t.fill_(5);
  i.add_(1);
  h.zero_();
  handle.wait();
  const StateDict back = load(dir / "f32");
  EXPECT_TRUE(bitwise_equal(back.at("a"), ra));
  EXPECT_TRUE(bitwise_equal(back.at("t"), rt));
  EXPECT_TRUE(bitwise_equal(back.at("i"), ri));
  EXPECT_TRUE(bitwise_equal(back.at("h"), rh));
}

TEST_F(CudaStaging, ConversionHappensOnTheDeviceAndMatchesTo) {
  TempDir dir;
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = 4 << 20, .staging = {.budget_bytes = 16 << 20}});
  at::Tensor a = at::randn({2, 1 << 20}, cuda());
  at::Tensor i = at::randint(0, 7, {100}, cuda(at::kInt));
  StateDict sd{{"a", a}, {"i", i}};
  const at::Tensor want = a.to(at::kBFloat16).cpu();
  snap.save_async("bf16", sd, {}, {.dtype = at::kBFloat16}).wait();
  const StateDict back = load(dir / "bf16");
  EXPECT_TRUE(bitwise_equal(back.at("a"), want));
  EXPECT_TRUE(bitwise_equal(back.at("i"), i.cpu()));  // integers keep their dtype
}

TEST_F(CudaStaging, LazySaveIsExactOnceStaged) {
  TempDir dir;
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = 2 << 20, .staging = {.budget_bytes = 8 << 20}});
  at::Tensor a = at::randn({5 << 20}, cuda());  // 20 MB through an 8 MB pool
  StateDict sd{{"a", a}};
  const at::Tensor ra = a.cpu();
  SaveHandle handle = snap.save_async("lazy", sd, {}, {.staging = Staging::kLazy});
  handle.wait_staged();
  a.fill_(3);
  handle.wait();
  EXPECT_TRUE(bitwise_equal(load(dir / "lazy").at("a"), ra));
  EXPECT_GT(handle.stats().buffer_waits, 0u);
}

TEST_F(CudaStaging, ReportsDeviceStagingThroughput) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(),
                    .chunk_bytes = 16 << 20,
                    .staging = {.budget_bytes = 2048ull << 20, .threads = 4}});
  StateDict sd;
  for (int k = 0; k < 12; ++k) sd.insert("w" + std::to_string(k), at::randn({32 << 20}, cuda()));
  const double gb = 12.0 * (32 << 20) * 4 / 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      SaveHandle h = snap.save_async("big", sd, {}, {.dtype = dtype, .overwrite = true});
      h.wait();
      const SaveStats s = h.stats();
      std::printf(
          "[cuda] %.2f GB fp32 on device -> %s: stall %.3f s (%.2f GB/s of source), "
          "durable %.3f s, engine %s%s\n",
          gb, c10::toString(dtype), s.stall_s, gb / s.stall_s, s.total_s, s.engine.c_str(),
          s.direct ? "+O_DIRECT" : "");
      EXPECT_LT(s.stall_s, s.total_s);
      EXPECT_EQ(s.tensor_bytes,
                dtype == at::kFloat ? 12ull * (32 << 20) * 4 : 12ull * (32 << 20) * 2);
    }
  }
  EXPECT_TRUE(verify(dir / "big").empty());
}

TEST_F(CudaStaging, LoadIntoDeviceDestinationsMatchesTheCpuLoadBitForBit) {
  TempDir dir;
  StateDict sd = test_support::mixed_state(5);
  sd.insert("big", make_tensor(at::kFloat, {300, 1000}, 6));  // many chunks, several shards
  save(dir / "s", sd, {}, {.num_shards = 3, .chunk_bytes = 64 << 10});
  for (const bool direct : {false, true}) {
    test_support::evict(dir / "s");
    StateDict dest = filled_on_cuda(sd, 0);
    const void* before = dest.at("big").data_ptr();
    LoadOptions o;
    o.direct_io = direct;
    const LoadReport r = load_into(dir / "s", dest, o);
    EXPECT_EQ(r.loaded, sd.keys());
    expect_same(sd, dest);
    EXPECT_EQ(dest.at("big").data_ptr(), before);  // in place
    EXPECT_TRUE(dest.at("big").is_cuda());
  }
}

TEST_F(CudaStaging, LoadIntoConvertsFloatingDtypesAsForTheCpu) {
  TempDir dir;
  StateDict sd{{"w", make_tensor(at::kFloat, {1000, 300}, 1)},
               {"h", make_tensor(at::kHalf, {777}, 2)},
               {"steps", make_tensor(at::kLong, {5}, 3)}};
  save(dir / "bf16", sd, {}, {.dtype = at::kBFloat16, .chunk_bytes = 64 << 10});
  // bf16 on disk into fp32 and fp16 destinations; integers keep their dtype.
  StateDict cpu{{"w", at::zeros({1000, 300})},
                {"h", at::zeros({777}, at::kHalf)},
                {"steps", at::zeros({5}, at::kLong)}};
  load_into(dir / "bf16", cpu);
  StateDict gpu = filled_on_cuda(cpu, 3);
  load_into(dir / "bf16", gpu);
  expect_same(cpu, gpu);
  EXPECT_EQ(gpu.at("w").scalar_type(), at::kFloat);
  EXPECT_TRUE(bitwise_equal(gpu.at("w"), sd.at("w").to(at::kBFloat16).to(at::kFloat)));
  // fp32 on disk into bf16 device tensors: the CPU's rounding.
  save(dir / "f32", sd, {}, {.chunk_bytes = 64 << 10});
  StateDict cpu16{{"w", at::zeros({1000, 300}, at::kBFloat16)}};
  StateDict gpu16 = filled_on_cuda(cpu16, 1);
  load_into(dir / "f32", cpu16, {.include = {"w"}});
  load_into(dir / "f32", gpu16, {.include = {"w"}});
  expect_same(cpu16, gpu16);
}

TEST_F(CudaStaging, LoadIntoDeviceBoxesOfAGlobalTensor) {
  TempDir dir;
  const at::Tensor whole = make_tensor(at::kFloat, {8, 6}, 4);
  // Stored whole, and stored as two row pieces (as two ranks would have saved it).
  save(dir / "whole", StateDict{{"w", whole}});
  StateDict pieces;
  pieces.insert("w", whole.narrow(0, 0, 5).contiguous(), {}, ShardSpec{{8, 6}, {0, 0}});
  save(dir / "rank0", pieces);
  for (const char* name : {"whole", "rank0"}) {
    StateDict dest;
    dest.insert("w", at::zeros({4, 3}, cuda()), {}, ShardSpec{{8, 6}, {1, 3}});
    load_into(dir / name, dest);
    EXPECT_TRUE(bitwise_equal(dest.at("w"), whole.narrow(0, 1, 4).narrow(1, 3, 3))) << name;
  }
  // A box the stored pieces do not cover is refused before anything is written.
  StateDict outside;
  outside.insert("w", at::full({4, 6}, 9.0, cuda()), {}, ShardSpec{{8, 6}, {4, 0}});
  error_of([&] { load_into(dir / "rank0", outside); }, ErrorCode::kShapeMismatch);
  EXPECT_TRUE(bitwise_equal(outside.at("w"), at::full({4, 6}, 9.0)));
}

TEST_F(CudaStaging, LazySaveIsOrderedAfterTheCallersStream) {
  // The caller trains on a stream of its own and its last kernel writes the tensor after a long
  // one; a lazy save stages on another thread, whose current stream is not the caller's, so it
  // must take its order from the caller's stream at the call.
  TempDir dir;
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = 4 << 20, .staging = {.budget_bytes = 16 << 20}});
  c10::impl::VirtualGuardImpl impl(at::kCUDA);
  const c10::Stream mine = impl.getStreamFromGlobalPool(c10::Device(at::kCUDA, 0));
  c10::StreamGuard guard(mine);
  at::Tensor w = at::zeros({4 << 20}, cuda());
  const at::Tensor m = at::randn({4096, 4096}, cuda());
  at::Tensor busy = m;
  for (int i = 0; i < 8; ++i) busy = at::mm(busy, m).div_(64);
  w.fill_(5);
  SaveHandle h = snap.save_async("lazy", StateDict{{"w", w}}, {}, {.staging = Staging::kLazy});
  h.wait();
  EXPECT_TRUE(bitwise_equal(load(dir / "lazy").at("w"), at::full({4 << 20}, 5.0)));
}

TEST_F(CudaStaging, LoadIntoIsOrderedAfterTheCallersStream) {
  TempDir dir;
  const at::Tensor want = make_tensor(at::kFloat, {4 << 20}, 7);
  save(dir / "s", StateDict{{"w", want}});
  // The caller works on a stream of its own; its last kernel writes the destination after a
  // long one, so a copy that did not wait for it would be overwritten.
  c10::impl::VirtualGuardImpl impl(at::kCUDA);
  const c10::Stream mine = impl.getStreamFromGlobalPool(c10::Device(at::kCUDA, 0));
  c10::StreamGuard guard(mine);
  StateDict dest{{"w", at::empty({4 << 20}, cuda())}};
  const at::Tensor m = at::randn({4096, 4096}, cuda());
  at::Tensor busy = m;
  for (int i = 0; i < 8; ++i) busy = at::mm(busy, m).div_(64);
  dest.at("w").fill_(5);
  load_into(dir / "s", dest);
  // Already there for any stream, with no synchronisation by the caller.
  EXPECT_TRUE(bitwise_equal(dest.at("w"), want));
}

TEST_F(CudaStaging, ProblemsFoundBeforeReadingLeaveDeviceDestinationsUnwritten) {
  TempDir dir;
  const StateDict sd{{"a", make_tensor(at::kFloat, {16, 8}, 1)},
                     {"steps", make_tensor(at::kLong, {4}, 2)}};
  save(dir / "s", sd);
  StateDict dest = filled_on_cuda(sd, 3);
  dest.set("steps", at::full({5}, 3, cuda(at::kLong)));
  const std::string what = error_of([&] { load_into(dir / "s", dest); }, ErrorCode::kShapeMismatch);
  EXPECT_TRUE(has(what, "nothing was written")) << what;
  EXPECT_TRUE(bitwise_equal(dest.at("a"), at::full({16, 8}, 3.0)));
  // A non-contiguous device destination is refused as a CPU one is.
  StateDict strided{{"a", at::zeros({8, 16}, cuda()).t()}};
  error_of([&] { load_into(dir / "s", strided, {.include = {"a"}}); }, ErrorCode::kInvalidArgument);
}

TEST_F(CudaStaging, AFailedReadLeavesDeviceDestinationsUnwrittenAndUnnamed) {
  TempDir dir;
  StateDict sd;
  const char* names[] = {"w.1st", "w.2nd", "w.3rd", "w.4th"};
  for (int i = 0; i < 4; ++i) sd.insert(names[i], make_tensor(at::kFloat, {2048}, 10 + i));
  save(dir / "s", sd, {}, {.num_shards = 1, .chunk_bytes = 8192});
  const Manifest m = read_manifest(dir / "s");
  test_support::flip_byte(dir / "s" / m.files[0].name, 3 * 8192 + 5);  // the 3rd and 4th
  StateDict dest{{"w.1st", at::zeros({2048})},
                 {"w.2nd", at::zeros({2048})},
                 {"w.3rd", at::full({2048}, 7.0, cuda())},
                 {"w.4th", at::full({2048}, 7.0, cuda())}};
  LoadOptions o;
  o.read_budget_bytes = 8192;
  const std::string what =
      error_of([&] { load_into(dir / "s", dest, o); }, ErrorCode::kHashMismatch);
  EXPECT_TRUE(has(what, "chunk 3")) << what;
  // Only CPU destinations can have been written (which, depends on the order of the reads).
  EXPECT_FALSE(has(what, "w.3rd") || has(what, "w.4th")) << what;
  EXPECT_TRUE(bitwise_equal(dest.at("w.3rd"), at::full({2048}, 7.0)));
  EXPECT_TRUE(bitwise_equal(dest.at("w.4th"), at::full({2048}, 7.0)));
  // Atomic: nothing anywhere.
  o.atomic = true;
  error_of([&] { load_into(dir / "s", dest, o); }, ErrorCode::kHashMismatch);
  EXPECT_TRUE(bitwise_equal(dest.at("w.4th"), at::full({2048}, 7.0)));
}

TEST_F(CudaStaging, LoadIntoDeviceDestinationsFromAHotSnapshot) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(), .chunk_bytes = 1 << 20, .staging = {.keep_hot = true}});
  StateDict sd{{"a", at::randn({3 << 20}, cuda())},
               {"i", at::randint(0, 9, {1000}, cuda(at::kInt))}};
  const StateDict want{{"a", sd.at("a").cpu()}, {"i", sd.at("i").cpu()}};
  snap.save_async("s", sd, {}, {.dtype = at::kBFloat16}).wait();
  const HotSnapshot hot = snap.hot_snapshot();
  ASSERT_TRUE(hot);
  StateDict dest = filled_on_cuda(want, 0);
  const LoadReport r = load_into(hot, dest);
  EXPECT_EQ(r.engine, "memory");
  EXPECT_TRUE(bitwise_equal(dest.at("a"), want.at("a").to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(bitwise_equal(dest.at("i"), want.at("i")));
}

// Prints the time of a load_into of 1.6 GB into device tensors against the same load into CPU
// tensors (both from the page cache), for the device-check log.
TEST_F(CudaStaging, ReportsDeviceLoadThroughput) {
  TempDir dir;
  StateDict sd;
  for (int k = 0; k < 12; ++k) sd.insert("w" + std::to_string(k), at::randn({32 << 20}, cuda()));
  save(dir / "big", sd);
  const double gb = static_cast<double>(sd.nbytes()) / 1e9;
  StateDict cpu, gpu = filled_on_cuda(sd, 0);
  for (const auto& [k, e] : sd) cpu.insert(k, at::zeros(e.tensor.sizes()));
  for (int rep = 0; rep < 3; ++rep) {
    const LoadReport c = load_into(dir / "big", cpu);
    const LoadReport g = load_into(dir / "big", gpu);
    std::printf(
        "[cuda] load_into %.2f GB: CPU destinations %.3f s, CUDA destinations %.3f s "
        "(%.2f GB/s), engine %s\n",
        gb, c.seconds, g.seconds, gb / g.seconds, g.engine.c_str());
  }
  expect_same(sd, gpu);
}

}  // namespace
}  // namespace tsnap
