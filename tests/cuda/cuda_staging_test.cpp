// The CUDA staging path (label `cuda`; every test skips without a CUDA device). Device tensors
// are converted on the device, copied to pinned staging buffers with non-blocking copies on a
// side stream, and the snapshot holds the values as of save_async (eager) / wait_staged (lazy).

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "stage/staging_pool.h"
#include "support/test_util.h"
#include "tsnap/load.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::TempDir;

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

}  // namespace
}  // namespace tsnap
