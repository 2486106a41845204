// tsnap::open: the lazy, memory-mapped reader. Lists tensors, reads whole tensors and row
// slices, verifies only the chunks a read touches, and opens shards only when needed.

#include "tsnap/reader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "restore/restore_util.h"
#include "tsnap/load.h"
#include "tsnap/save.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::error_of;
using test_support::has;
using test_support::make_tensor;
using test_support::TempDir;

TEST(Reader, ListsAndReadsEveryTensorOfEveryDtype) {
  TempDir dir;
  const StateDict sd = test_support::mixed_state(5);
  save(dir / "s", sd, {}, {.num_shards = 2});
  const SnapshotReader r = open(dir / "s");
  EXPECT_EQ(r.keys(), sd.keys());
  EXPECT_EQ(r.manifest().tensors.size(), sd.size());
  for (const auto& [key, e] : sd) {
    EXPECT_TRUE(r.contains(key));
    EXPECT_TRUE(bitwise_equal(r.read(key), e.tensor)) << key;
  }
  EXPECT_FALSE(r.contains("nope"));
  error_of([&] { r.read("nope"); }, ErrorCode::kKeyNotFound);
}

TEST(Reader, RowSlicesEqualNarrowAlongDimZero) {
  TempDir dir;
  const at::Tensor w = make_tensor(at::kBFloat16, {50, 3, 7}, 1);
  save(dir / "s", StateDict{{"w", w}, {"s", at::ones({})}});
  const SnapshotReader r = open(dir / "s");
  EXPECT_TRUE(bitwise_equal(r.read_rows("w", 10, 5), w.narrow(0, 10, 5)));
  EXPECT_TRUE(bitwise_equal(r.read_rows("w", 0, 50), w));
  EXPECT_TRUE(bitwise_equal(r.read_rows("w", 49, 1), w.narrow(0, 49, 1)));
  EXPECT_EQ(r.read_rows("w", 50, 0).sizes(), at::IntArrayRef({0, 3, 7}));
  error_of([&] { r.read_rows("w", 45, 6); }, ErrorCode::kInvalidArgument);
  error_of([&] { r.read_rows("w", -1, 2); }, ErrorCode::kInvalidArgument);
  error_of([&] { r.read_rows("s", 0, 1); }, ErrorCode::kInvalidArgument);
}

TEST(Reader, VerifiesOnlyTheChunksARead) {
  TempDir dir;
  // 3 tensors of 64 KiB, 64 KiB chunks: "a" in chunks 0-1, "c" in chunks 2-3.
  StateDict sd{{"a", make_tensor(at::kFloat, {16384}, 1)},
               {"b", make_tensor(at::kFloat, {16384}, 2)},
               {"c", make_tensor(at::kFloat, {16384}, 3)}};
  save(dir / "s", sd, {}, {.num_shards = 1, .chunk_bytes = 64 << 10});
  const Manifest m = read_manifest(dir / "s");
  const TensorRecord& c = *m.find("c");
  test_support::flip_byte(dir / "s" / m.files[0].name, c.end - 10);  // the last chunk
  const uint64_t bad_chunk = (c.end - 10) / (64 << 10);

  const SnapshotReader r = open(dir / "s");
  EXPECT_TRUE(bitwise_equal(r.read("a"), sd.at("a")));
  EXPECT_TRUE(bitwise_equal(r.read_rows("c", 0, 100), sd.at("c").narrow(0, 0, 100)));
  const std::string what = error_of([&] { r.read("c"); }, ErrorCode::kHashMismatch);
  EXPECT_TRUE(has(what, "chunk " + std::to_string(bad_chunk))) << what;

  const SnapshotReader unchecked = open(dir / "s", {.verify = false});
  EXPECT_FALSE(bitwise_equal(unchecked.read("c"), sd.at("c")));
}

TEST(Reader, TensorsOutliveTheReaderAndWritesToThemStayPrivate) {
  TempDir dir;
  const at::Tensor w = make_tensor(at::kFloat, {1000}, 1);
  save(dir / "s", StateDict{{"w", w}});
  at::Tensor view;
  {
    const SnapshotReader r = open(dir / "s");
    view = r.read("w");
  }
  EXPECT_TRUE(bitwise_equal(view, w));
  view.fill_(42);  // copy-on-write: the file keeps its bytes
  EXPECT_TRUE(bitwise_equal(open(dir / "s").read("w"), w));
  EXPECT_TRUE(test_support::bitwise_equal(load(dir / "s").at("w"), w));
}

TEST(Reader, ShardsAreOpenedOnlyWhenAReadNeedsThem) {
  TempDir dir;
  StateDict sd{{"x", make_tensor(at::kFloat, {1000}, 1)},
               {"y", make_tensor(at::kFloat, {1000}, 2)}};
  save(dir / "s", sd, {}, {.num_shards = 2});
  const Manifest m = read_manifest(dir / "s");
  const std::string lost = m.find("y")->file;
  ASSERT_NE(lost, m.find("x")->file);
  std::filesystem::remove(dir / "s" / lost);
  const SnapshotReader r = open(dir / "s");
  EXPECT_TRUE(bitwise_equal(r.read("x"), sd.at("x")));
  const std::string what = error_of([&] { r.read("y"); }, ErrorCode::kNotFound);
  EXPECT_TRUE(has(what, lost)) << what;
}

}  // namespace
}  // namespace tsnap
