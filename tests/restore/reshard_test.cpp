// Tests of the resharding arithmetic (src/restore/reshard.h): every overlap of two boxes is
// checked element by element against a brute-force reference.

#include "restore/reshard.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace tsnap::restore {
namespace {

// Row-major index of global coordinates `at` inside `box`, or -1 when outside.
int64_t index_in(const Box& box, const std::vector<int64_t>& at) {
  int64_t i = 0;
  for (size_t d = 0; d < at.size(); ++d) {
    const int64_t local = at[d] - box.offsets[d];
    if (local < 0 || local >= box.shape[d]) return -1;
    i = i * box.shape[d] + local;
  }
  return i;
}

// Every global coordinate of `global`, in row-major order.
std::vector<std::vector<int64_t>> coordinates(const std::vector<int64_t>& global) {
  std::vector<std::vector<int64_t>> out{{}};
  for (int64_t size : global) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& c : out) {
      for (int64_t i = 0; i < size; ++i) {
        next.push_back(c);
        next.back().push_back(i);
      }
    }
    out = std::move(next);
  }
  return out;
}

void expect_runs_match(const std::vector<int64_t>& global, const Box& from, const Box& to) {
  std::map<int64_t, int64_t> want;  // to-index -> from-index
  for (const auto& c : coordinates(global)) {
    const int64_t f = index_in(from, c), t = index_in(to, c);
    if (f >= 0 && t >= 0) want[t] = f;
  }
  std::map<int64_t, int64_t> got;
  for (const restore::Run& r : overlap_runs(from, to)) {
    for (uint64_t k = 0; k < r.n; ++k) {
      EXPECT_TRUE(got.emplace(r.dst + k, r.src + k).second) << "element written twice";
    }
  }
  EXPECT_EQ(got, want);
}

TEST(Reshard, DimZeroPiecesGiveOneRun) {
  const Box from{{4, 0}, {4, 5}}, to{{2, 0}, {4, 5}};
  const std::vector<restore::Run> runs = overlap_runs(from, to);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].src, 0u);
  EXPECT_EQ(runs[0].dst, 10u);
  EXPECT_EQ(runs[0].n, 10u);
  expect_runs_match({8, 5}, from, to);
}

TEST(Reshard, DisjointBoxesGiveNoRuns) {
  EXPECT_TRUE(overlap_runs({{0, 0}, {4, 5}}, {{4, 0}, {4, 5}}).empty());
  EXPECT_TRUE(overlap_runs({{0}, {0}}, {{0}, {3}}).empty());
}

TEST(Reshard, ScalarsOverlapWhole) {
  const std::vector<restore::Run> runs = overlap_runs({{}, {}}, {{}, {}});
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].n, 1u);
}

TEST(Reshard, RandomBoxesMatchBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t dims = 1 + rng() % 4;
    std::vector<int64_t> global(dims);
    for (auto& g : global) g = 1 + static_cast<int64_t>(rng() % 5);
    const auto random_box = [&] {
      Box b;
      for (size_t d = 0; d < dims; ++d) {
        const int64_t lo = static_cast<int64_t>(rng() % static_cast<uint64_t>(global[d]));
        const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(global[d] - lo));
        // Half the time a dimension is full, as in pieces cut along one dimension.
        const bool full = rng() % 2 == 0;
        b.offsets.push_back(full ? 0 : lo);
        b.shape.push_back(full ? global[d] : len);
      }
      return b;
    };
    expect_runs_match(global, random_box(), random_box());
  }
}

}  // namespace
}  // namespace tsnap::restore
