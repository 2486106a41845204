// The save plan: stored dtypes, balanced shard files, aligned offsets, chunking and the
// interleaved chunk order, and the input it refuses before anything is written.

#include "plan/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "support/test_util.h"
#include "tsnap/error.h"

namespace tsnap::plan {
namespace {

using test_support::make_tensor;

StateDict sized_state() {
  StateDict sd;
  sd.insert("big", make_tensor(at::kFloat, {300000}, 1));    // 1.2 MB
  sd.insert("mid", make_tensor(at::kFloat, {200000}, 2));    // 0.8 MB
  sd.insert("small", make_tensor(at::kFloat, {100000}, 3));  // 0.4 MB
  sd.insert("steps", make_tensor(at::kLong, {3}, 4));
  sd.insert("half", make_tensor(at::kHalf, {5}, 5));
  return sd;
}

TEST(Plan, FilesAreBalancedByBytesAndEveryTensorIsPlacedOnce) {
  SaveOptions o;
  o.num_shards = 2;
  const Plan p = make_plan(sized_state(), o, 1 << 20, "id1", 4);
  ASSERT_EQ(p.files.size(), 2u);
  EXPECT_EQ(p.num_tensors, 5u);
  std::set<std::string> seen;
  for (const PlannedFile& f : p.files) {
    for (const PlannedTensor& t : f.tensors) EXPECT_TRUE(seen.insert(t.name).second) << t.name;
  }
  EXPECT_EQ(seen.size(), 5u);
  // Largest first onto the lightest file: "big" alone, "mid" and "small" together.
  EXPECT_EQ(p.files[0].tensors.size() + p.files[1].tensors.size(), 5u);
  uint64_t sum = 0;
  for (const PlannedFile& f : p.files) sum += f.size;
  EXPECT_EQ(sum, p.total_bytes);
}

TEST(Plan, OffsetsFollowTheHeaderAlignedAndWithoutHoles) {
  const Plan p = make_plan(sized_state(), {}, 1 << 20, "id2", 4);
  for (const PlannedFile& f : p.files) {
    EXPECT_EQ(f.data_offset % 4096, 0u);
    EXPECT_EQ(f.header.size(), f.data_offset);
    uint64_t expected = f.data_offset;
    size_t prev_elem = 16;
    for (const PlannedTensor& t : f.tensors) {
      EXPECT_EQ(t.begin, expected) << t.name;
      const size_t elem = at::elementSize(t.dtype);
      EXPECT_LE(elem, prev_elem) << "element size descending: " << t.name;
      EXPECT_EQ(t.begin % elem, 0u) << t.name;
      prev_elem = elem;
      expected = t.end;
    }
    EXPECT_EQ(f.size, expected);
  }
}

TEST(Plan, ChunksCoverEveryFileAndInterleaveAcrossFiles) {
  SaveOptions o;
  o.num_shards = 2;
  const uint64_t chunk = 256 << 10;
  const Plan p = make_plan(sized_state(), o, chunk, "id3", 4);
  std::vector<uint64_t> next(p.files.size(), 0);
  for (size_t i = 0; i < p.chunks.size(); ++i) {
    const ChunkRef& c = p.chunks[i];
    EXPECT_EQ(c.chunk, next[c.file]++) << "chunks of a file in order";
    if (i > 0 && p.chunks[i - 1].chunk == c.chunk) EXPECT_NE(p.chunks[i - 1].file, c.file);
  }
  for (size_t f = 0; f < p.files.size(); ++f) {
    EXPECT_EQ(next[f], p.files[f].num_chunks());
    const PlannedFile& file = p.files[f];
    EXPECT_EQ(file.chunk_end(file.num_chunks() - 1), file.size);
  }
  EXPECT_EQ(p.chunks[0].file, 0u);
  EXPECT_EQ(p.chunks[1].file, 1u);
}

TEST(Plan, FloatingTensorsConvertIntegersNever) {
  SaveOptions o;
  o.dtype = at::kBFloat16;
  const Plan p = make_plan(sized_state(), o, 1 << 20, "id4", 1);
  for (const PlannedTensor& t : p.files[0].tensors) {
    if (t.name == "steps") {
      EXPECT_EQ(t.dtype, at::kLong);
    } else {
      EXPECT_EQ(t.dtype, at::kBFloat16) << t.name;
      EXPECT_EQ(t.nbytes(), static_cast<uint64_t>(t.source.numel()) * 2) << t.name;
    }
  }
}

// The precision rule: counters and scalars keep their dtype; per-key rules refine the dtype;
// an entry's own dtype wins over both.
TEST(Plan, CountersAndScalarsKeepTheirDtypeAndRulesRefineIt) {
  StateDict sd;
  sd.insert("optim/w/exp_avg", make_tensor(at::kFloat, {8}, 1));
  sd.insert("optim/w/exp_avg_sq", make_tensor(at::kFloat, {8}, 2));
  sd.insert("optim/w/step", at::full({}, 2049.0f));   // PyTorch's Adam: 0-d float
  sd.insert("optim/v/step", at::full({1}, 2049.0f));  // a counter by its name
  sd.insert("loss_scale", at::full({}, 65536.0f));    // a scalar
  sd.insert("model/w", make_tensor(at::kFloat, {8}, 3));
  sd.insert("model/keep", make_tensor(at::kFloat, {8}, 4));
  sd.insert("forced", at::full({}, 3.0f), at::kHalf);  // asked by its entry
  sd.insert("global_step", at::full({1}, 1001.0f));    // a counter kept in a 1-element tensor
  sd.insert("scaler/scale", at::full({1}, 65539.0f));  // fp16 would make it inf
  SaveOptions o;
  o.dtype = at::kBFloat16;
  o.dtype_rules = {{"*.exp_avg_sq", at::kFloat},
                   {"*/exp_avg_sq", at::kFloat},
                   {"model/keep", std::nullopt},
                   {"scaler/*", at::kHalf}};
  const std::map<std::string, at::ScalarType> want = {
      {"optim/w/exp_avg", at::kBFloat16}, {"optim/w/exp_avg_sq", at::kFloat},
      {"optim/w/step", at::kFloat},       {"optim/v/step", at::kFloat},
      {"loss_scale", at::kFloat},         {"model/w", at::kBFloat16},
      {"model/keep", at::kFloat},         {"forced", at::kHalf},
      {"global_step", at::kFloat},        {"scaler/scale", at::kFloat}};
  for (const auto& [key, entry] : sd) {
    EXPECT_EQ(stored_dtype(key, entry, o), want.at(key)) << key;
  }
  // A rule that matches only what the precision rule keeps would be ignored: an error.
  o.dtype_rules = {{"*/step", at::kBFloat16}};
  try {
    check_dtype_rules(sd, o);
    ADD_FAILURE() << "a rule that cannot apply was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("*/step"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("optim/"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_plan(sd, o, 4096, "x", 1), InvalidArgument);
  o.dtype_rules = {{"scaler/*", at::kHalf}, {"*", at::kHalf}};  // the first cannot apply
  EXPECT_THROW(check_dtype_rules(sd, o), InvalidArgument);
  o.dtype_rules = {{"*", at::kHalf}};  // converts some keys: fine
  EXPECT_NO_THROW(check_dtype_rules(sd, o));
  o.dtype_rules = {{"model/*", at::kInt}};
  EXPECT_THROW(stored_dtype("model/w", sd.entry("model/w"), o), InvalidArgument);
  o.dtype_rules = {{"model/[w", at::kHalf}};
  EXPECT_THROW(stored_dtype("model/w", sd.entry("model/w"), o), InvalidArgument);
}

TEST(Plan, RefusesBadChunkSizesAndSparseTensorsNamingThem) {
  EXPECT_THROW(make_plan(sized_state(), {}, 1000, "x", 1), InvalidArgument);
  EXPECT_THROW(make_plan(sized_state(), {}, 0, "x", 1), InvalidArgument);
  StateDict bad;
  bad.insert("ghost", at::ones({4}).to_sparse());
  try {
    make_plan(bad, {}, 1 << 20, "x", 1);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ghost"), std::string::npos) << e.what();
  }
}

// Every field of two plans' files, sources compared by identity.
void expect_same_files(const Plan& a, const Plan& b) {
  ASSERT_EQ(a.files.size(), b.files.size());
  EXPECT_EQ(a.total_bytes, b.total_bytes);
  EXPECT_EQ(a.num_tensors, b.num_tensors);
  ASSERT_EQ(a.chunks.size(), b.chunks.size());
  for (size_t c = 0; c < a.chunks.size(); ++c) {
    EXPECT_EQ(a.chunks[c].file, b.chunks[c].file);
    EXPECT_EQ(a.chunks[c].chunk, b.chunks[c].chunk);
  }
  for (size_t f = 0; f < a.files.size(); ++f) {
    const PlannedFile &x = a.files[f], &y = b.files[f];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.header, y.header) << x.name;
    EXPECT_EQ(x.header_id, y.header_id);
    EXPECT_EQ(x.size, y.size);
    ASSERT_EQ(x.tensors.size(), y.tensors.size());
    for (size_t i = 0; i < x.tensors.size(); ++i) {
      const PlannedTensor &s = x.tensors[i], &t = y.tensors[i];
      EXPECT_EQ(s.name, t.name);
      EXPECT_TRUE(s.source.is_same(t.source)) << s.name;
      EXPECT_EQ(s.dtype, t.dtype);
      EXPECT_EQ(s.source_dtype, t.source_dtype);
      EXPECT_EQ(s.shape, t.shape);
      EXPECT_EQ(s.begin, t.begin);
      EXPECT_EQ(s.end, t.end);
    }
  }
}

// A plan reused for a state alike is the plan made anew (its headers carry the new id, its
// sources are the new tensors); a state that differs in a key, shape or dtype, or other
// options, is planned anew.
TEST(Plan, ReusesThePreviousLayoutForAStateAlike) {
  SaveOptions o;
  o.num_shards = 2;
  o.dtype = at::kBFloat16;
  const std::string id1 = "0000000000000001-00000001", id2 = "0000000000000002-00000002";
  // A plan as the Snapshotter keeps it: without the caller's tensors.
  const auto kept = [&](const StateDict& sd) {
    Plan p = make_plan(sd, o, 1 << 20, id1, 4);
    for (PlannedFile& f : p.files) {
      for (PlannedTensor& t : f.tensors) t.source.reset();
    }
    return p;
  };
  Plan first = kept(sized_state());
  EXPECT_FALSE(first.reused);
  ASSERT_EQ(first.entries.size(), 5u);
  const StateDict next = sized_state();  // new tensors, same keys, shapes and dtypes
  Layout layout;
  layout.previous = {&first};
  const Plan reused = make_plan(next, o, 1 << 20, id2, 4, {}, layout);
  EXPECT_TRUE(reused.reused);
  EXPECT_EQ(reused.id, id2);
  EXPECT_TRUE(first.entries.empty()) << "the reused plan was copied, not moved";
  const Plan fresh = make_plan(next, o, 1 << 20, id2, 4);
  expect_same_files(reused, fresh);

  // Each of these is planned anew, and leaves the kept plan as it was.
  const auto planned_anew = [&](const StateDict& sd, const SaveOptions& opts, uint64_t chunk) {
    Plan previous = kept(sized_state());
    Layout l;
    l.previous = {&previous};
    const Plan p = make_plan(sd, opts, chunk, id2, 4, {}, l);
    EXPECT_EQ(previous.entries.size(), 5u);
    expect_same_files(p, make_plan(sd, opts, chunk, id2, 4));
    return !p.reused;
  };
  StateDict other_shape = sized_state();
  other_shape.set("mid", make_tensor(at::kFloat, {200001}, 2));
  StateDict other_dtype = sized_state();
  other_dtype.set("steps", make_tensor(at::kInt, {3}, 4));
  StateDict other_key = sized_state();
  other_key.erase("half");
  other_key.insert("halves", make_tensor(at::kHalf, {5}, 5));
  StateDict more = sized_state();
  more.insert("extra", make_tensor(at::kFloat, {7}, 6));
  StateDict per_entry = sized_state();
  per_entry.erase("big");
  per_entry.insert("big", make_tensor(at::kFloat, {300000}, 1), at::kFloat);
  EXPECT_TRUE(planned_anew(other_shape, o, 1 << 20));
  EXPECT_TRUE(planned_anew(other_dtype, o, 1 << 20));
  EXPECT_TRUE(planned_anew(other_key, o, 1 << 20));
  EXPECT_TRUE(planned_anew(more, o, 1 << 20));
  EXPECT_TRUE(planned_anew(per_entry, o, 1 << 20));
  EXPECT_TRUE(planned_anew(next, o, 2 << 20));
  SaveOptions three = o;
  three.num_shards = 3;
  EXPECT_TRUE(planned_anew(next, three, 1 << 20));
  SaveOptions fp32 = o;
  fp32.dtype.reset();
  EXPECT_TRUE(planned_anew(next, fp32, 1 << 20));
  // Of several kept plans, the one that fits is taken; the others stay as they were.
  Plan other = kept(more);
  Plan alike = kept(sized_state());
  layout.previous = {&other, &alike};
  const Plan second = make_plan(next, o, 1 << 20, id2, 4, {}, layout);
  EXPECT_TRUE(second.reused);
  EXPECT_TRUE(alike.entries.empty());
  EXPECT_EQ(other.entries.size(), 6u);
  expect_same_files(second, fresh);
}

TEST(Plan, EmptyStateHasOneEmptyFile) {
  const Plan p = make_plan(StateDict(), {}, 1 << 20, "id5", 4);
  ASSERT_EQ(p.files.size(), 1u);
  EXPECT_TRUE(p.files[0].tensors.empty());
  EXPECT_EQ(p.tensor_bytes, 0u);
}

}  // namespace
}  // namespace tsnap::plan

namespace tsnap::plan {
namespace {

// Each replicated entry is planned by exactly one rank, the same whichever rank plans, and
// the ranks' bytes are balanced; pieces stay with their rank.
TEST(PlanRanks, ReplicatedEntriesAreSharedOutOnce) {
  StateDict sd;
  for (int i = 0; i < 10; ++i) {
    sd.insert("w" + std::to_string(i), at::zeros({(i + 1) * 1000}, at::kFloat));
  }
  sd.insert("piece", at::zeros({4}, at::kFloat), {}, ShardSpec{{16}, {4}});
  std::map<std::string, int> owner;
  std::vector<uint64_t> bytes;
  for (int r = 0; r < 3; ++r) {
    const Plan p = make_plan(sd, {}, 1 << 20, "id", 1, {r, 3});
    EXPECT_EQ(p.replicated.size(), 10u);
    uint64_t b = 0;
    for (const PlannedFile& f : p.files) {
      EXPECT_EQ(f.name.rfind("rank-0000" + std::to_string(r) + "-", 0), 0u) << f.name;
      for (const PlannedTensor& t : f.tensors) {
        if (t.name == "piece") continue;
        EXPECT_TRUE(owner.emplace(t.name, r).second) << t.name << " planned twice";
        b += t.nbytes();
      }
    }
    bytes.push_back(b);
  }
  EXPECT_EQ(owner.size(), 10u);
  const auto [lo, hi] = std::minmax_element(bytes.begin(), bytes.end());
  EXPECT_LE(*hi - *lo, 10000u * 4);  // at most the largest entry apart
  EXPECT_THROW(make_plan(sd, {}, 1 << 20, "id", 1, {3, 3}), InvalidArgument);
}

}  // namespace
}  // namespace tsnap::plan
