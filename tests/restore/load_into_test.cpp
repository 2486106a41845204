// tsnap::load_into and tsnap::load with bad input: every problem that the manifest or the shard
// sizes reveal is reported before any destination byte changes, with a clear error.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "restore/restore_util.h"
#include "tsnap/load.h"
#include "tsnap/reader.h"
#include "tsnap/save.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::clone;
using test_support::error_of;
using test_support::has;
using test_support::make_tensor;
using test_support::same_state;
using test_support::TempDir;

class LoadInto : public ::testing::Test {
 protected:
  void SetUp() override {
    sd_ = StateDict{{"a.w", make_tensor(at::kFloat, {16, 8}, 1)},
                    {"a.b", make_tensor(at::kFloat, {8}, 2)},
                    {"steps", make_tensor(at::kLong, {4}, 3)}};
    save(path(), sd_, {}, {.num_shards = 2});
    dest_ = test_support::filled_like(sd_, 3);
    before_ = clone(dest_);
  }
  std::filesystem::path path() const { return dir_ / "s"; }
  // The destination is exactly as it was before the failed call.
  void expect_untouched() const { EXPECT_TRUE(same_state(before_, dest_)); }

  TempDir dir_;
  StateDict sd_, dest_, before_;
};

TEST_F(LoadInto, ShapeMismatchesAreAllListedBeforeAnyByteChanges) {
  dest_.set("a.w", at::full({8, 16}, 3.0));
  dest_.set("steps", at::full({5}, 3, at::kLong));
  before_ = clone(dest_);
  const std::string what = error_of([&] { load_into(path(), dest_); }, ErrorCode::kShapeMismatch);
  EXPECT_TRUE(has(what, "a.w: shape [16, 8] in the snapshot, [8, 16] in the destination")) << what;
  EXPECT_TRUE(has(what, "steps: shape [4]")) << what;
  EXPECT_TRUE(has(what, "nothing was written")) << what;
  expect_untouched();  // a.b fitted, but was not written either
}

TEST_F(LoadInto, IntegerAndFloatingDtypesDoNotConvert) {
  dest_.set("steps", at::full({4}, 3.0));
  before_ = clone(dest_);
  const std::string what = error_of([&] { load_into(path(), dest_); }, ErrorCode::kShapeMismatch);
  EXPECT_TRUE(has(what, "steps: dtype Long in the snapshot cannot be loaded into Float")) << what;
  expect_untouched();
}

TEST_F(LoadInto, DestinationKeysMissingFromTheSnapshotAreErrors) {
  dest_.insert("c.w", at::zeros({2}));
  dest_.insert("d.w", at::zeros({2}));
  before_ = clone(dest_);
  const std::string what = error_of([&] { load_into(path(), dest_); }, ErrorCode::kKeyNotFound);
  EXPECT_TRUE(has(what, "2 destination keys are not in the snapshot: c.w, d.w")) << what;
  expect_untouched();
  // Narrowed by a glob to keys the snapshot has, the same destination loads.
  load_into(path(), dest_, {.include = {"a.*"}});
  EXPECT_TRUE(bitwise_equal(dest_.at("a.w"), sd_.at("a.w")));
}

TEST_F(LoadInto, SnapshotKeysTheDestinationLacksAreReported) {
  dest_.erase("steps");
  const LoadReport r = load_into(path(), dest_);
  EXPECT_EQ(r.loaded, (std::vector<std::string>{"a.b", "a.w"}));
  EXPECT_EQ(r.not_in_destination, std::vector<std::string>{"steps"});
  EXPECT_FALSE(r.engine.empty());
}

// With a key prefix, patterns apply to the keys without it; a pattern written with the prefix
// and a prefix that no key has are both told as such, not as "matches no key".
TEST(LoadIntoPrefix, PatternsWithThePrefixAndAPrefixNoKeyHasAreNamed) {
  TempDir dir;
  save(dir / "c", StateDict{{"model/fc1.w", make_tensor(at::kFloat, {4}, 1)},
                            {"model/fc2.w", make_tensor(at::kFloat, {4}, 2)}});
  StateDict dest{{"fc1.w", at::zeros({4})}};
  const std::string with_prefix = error_of(
      [&] { load_into(dir / "c", dest, {.include = {"model/fc1.*"}, .key_prefix = "model/"}); },
      ErrorCode::kInvalidArgument);
  EXPECT_TRUE(has(with_prefix, "pattern 'model/fc1.*' starts with the key prefix 'model/'"))
      << with_prefix;
  EXPECT_TRUE(has(with_prefix, "('fc1.*')")) << with_prefix;
  const std::string no_prefix = error_of(
      [&] { load_into(dir / "c", dest, {.key_prefix = "modle/"}); }, ErrorCode::kKeyNotFound);
  EXPECT_TRUE(has(no_prefix, "starts with the key prefix 'modle/'")) << no_prefix;
  load_into(dir / "c", dest, {.include = {"fc1.*"}, .key_prefix = "model/"});
  EXPECT_TRUE(bitwise_equal(dest.at("fc1.w"), make_tensor(at::kFloat, {4}, 1)));
}

TEST_F(LoadInto, NonContiguousDestinationsAreRefused) {
  const at::Tensor base = at::zeros({8, 16});
  dest_.set("a.w", base.t());
  const std::string what = error_of([&] { load_into(path(), dest_); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(has(what, "must be contiguous, strided tensors with storage: a.w")) << what;
  EXPECT_TRUE(bitwise_equal(base, at::zeros({8, 16})));
}

TEST_F(LoadInto, MissingShardIsNamedAndNothingIsWritten) {
  const Manifest m = read_manifest(path());
  ASSERT_EQ(m.files.size(), 2u);
  std::filesystem::remove(path() / m.files[1].name);
  const std::string what = error_of([&] { load_into(path(), dest_); }, ErrorCode::kNotFound);
  EXPECT_TRUE(has(what, m.files[1].name)) << what;
  expect_untouched();
  error_of([&] { load(path()); }, ErrorCode::kNotFound);
}

TEST_F(LoadInto, TruncatedShardIsNamedAndNothingIsWritten) {
  const Manifest m = read_manifest(path());
  const auto shard = path() / m.files[1].name;
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 4);
  const std::string what = error_of([&] { load_into(path(), dest_); }, ErrorCode::kTruncated);
  EXPECT_TRUE(has(what, m.files[1].name) && has(what, "truncated")) << what;
  expect_untouched();
}

TEST_F(LoadInto, NewerFormatVersionIsRefusedByEveryReader) {
  test_support::set_format_version(path(), kFormatVersion + 1);
  const std::string what =
      error_of([&] { load_into(path(), dest_); }, ErrorCode::kUnsupportedFormat);
  EXPECT_TRUE(has(what, std::to_string(kFormatVersion + 1))) << what;
  expect_untouched();
  error_of([&] { load(path()); }, ErrorCode::kUnsupportedFormat);
  error_of([&] { open(path()); }, ErrorCode::kUnsupportedFormat);
}

TEST_F(LoadInto, AtomicLoadLargerThanTheReadBudgetIsRefusedUpFront) {
  const std::string what =
      error_of([&] { load_into(path(), dest_, {.atomic = true, .read_budget_bytes = 1}); },
               ErrorCode::kInvalidArgument);
  EXPECT_TRUE(has(what, "read_budget_bytes")) << what;
  expect_untouched();
  load_into(path(), dest_, {.atomic = true});
  EXPECT_TRUE(same_state(sd_, dest_));
}

TEST_F(LoadInto, MissingSnapshotIsNotFound) {
  error_of([&] { load_into(dir_ / "nope", dest_); }, ErrorCode::kNotFound);
  expect_untouched();
}

}  // namespace
}  // namespace tsnap
