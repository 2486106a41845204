// Round trips through tsnap::save / tsnap::load, and the layout of what lands on disk.

#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "format/safetensors.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/save.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::make_tensor;
using test_support::TempDir;

void expect_same(const StateDict& want, const StateDict& got) {
  ASSERT_EQ(want.keys(), got.keys());
  for (const auto& [key, entry] : want) {
    EXPECT_TRUE(bitwise_equal(entry.tensor.contiguous(), got.at(key))) << key;
  }
}

TEST(SaveLoad, EveryDtypeAndAwkwardShapes) {
  TempDir dir;
  const StateDict sd = test_support::mixed_state();
  save(dir / "s", sd, {{"step", 7}, {"note", "hi"}});
  expect_same(sd, load(dir / "s"));
  const Manifest m = read_manifest(dir / "s");
  EXPECT_EQ(m.metadata["step"], 7);
  EXPECT_EQ(m.metadata["note"], "hi");
  EXPECT_EQ(m.format_version, kFormatVersion);
  EXPECT_EQ(m.tensors.size(), sd.size());
  EXPECT_FALSE(m.tsnap_version.empty());
  EXPECT_FALSE(m.torch_version.empty());
  EXPECT_EQ(m.world_size, 1);
}

// Progress calls never overlap, only grow, end at the total, and a save's last one comes before
// it completes.
struct ProgressLog {
  std::mutex mu;
  std::vector<Progress> calls;
  bool overlapped = false;
  bool busy = false;
  ProgressFn fn() {
    return [this](const Progress& p) {
      if (busy) overlapped = true;
      busy = true;
      {
        std::lock_guard<std::mutex> lock(mu);
        calls.push_back(p);
      }
      busy = false;
    };
  }
  void expect_complete(uint64_t total) {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_FALSE(overlapped);
    ASSERT_GE(calls.size(), 2u);
    for (size_t i = 1; i < calls.size(); ++i) {
      EXPECT_GE(calls[i].done_bytes, calls[i - 1].done_bytes);
      EXPECT_GE(calls[i].staged_bytes, calls[i - 1].staged_bytes);
    }
    for (const Progress& p : calls) {
      EXPECT_EQ(p.total_bytes, total);
      EXPECT_LE(p.done_bytes, p.staged_bytes);
    }
    EXPECT_EQ(calls.back().done_bytes, total);
    EXPECT_EQ(calls.back().staged_bytes, total);
  }
};

TEST(SaveLoad, ProgressReachesTheTotalOfSaveAndLoad) {
  TempDir dir;
  StateDict sd;
  for (int i = 0; i < 6; ++i)
    sd.insert("w" + std::to_string(i), make_tensor(at::kFloat, {300000}, i));
  ProgressLog saving;
  const SaveStats stats =
      save(dir / "s", sd, {}, {.chunk_bytes = 1 << 20, .progress = saving.fn()});
  uint64_t shard_bytes = 0;
  for (const auto& f : read_manifest(dir / "s").files) shard_bytes += f.size;
  saving.expect_complete(shard_bytes);
  EXPECT_GE(saving.calls.size(), 2 * stats.chunks);  // staged and written, per chunk

  ProgressLog loading;
  const StateDict back = load(dir / "s", {.progress = loading.fn()});
  loading.expect_complete(shard_bytes);
  expect_same(sd, back);
}

TEST(SaveLoad, NonContiguousTensorsSaveTheirValues) {
  TempDir dir;
  const at::Tensor base = make_tensor(at::kFloat, {8, 6}, 3);
  StateDict sd{{"t", base.t()}, {"slice", base.narrow(1, 1, 3)}, {"step", base.select(1, 2)}};
  save(dir / "s", sd);
  const StateDict back = load(dir / "s");
  EXPECT_TRUE(bitwise_equal(back.at("t"), base.t().contiguous()));
  EXPECT_TRUE(bitwise_equal(back.at("slice"), base.narrow(1, 1, 3).contiguous()));
  EXPECT_TRUE(bitwise_equal(back.at("step"), base.select(1, 2).contiguous()));
}

TEST(SaveLoad, ManySmallTensorsAndOneLargerThanAChunk) {
  TempDir dir;
  StateDict sd;
  for (int i = 0; i < 3000; ++i) {
    sd.insert("small." + std::to_string(i), make_tensor(at::kFloat, {1 + i % 97}, i));
  }
  sd.insert("big", make_tensor(at::kFloat, {3, 1000, 1000}, 99));  // 12 MB > 1 MiB chunks
  const SaveStats stats = save(dir / "s", sd, {}, {.num_shards = 3, .chunk_bytes = 1 << 20});
  EXPECT_EQ(stats.files, 3u);
  EXPECT_GT(stats.chunks, 12u);
  expect_same(sd, load(dir / "s"));
  EXPECT_TRUE(verify(dir / "s").empty());
}

TEST(SaveLoad, ShardFilesFollowTheSafetensorsLayout) {
  TempDir dir;
  StateDict sd{{"a", make_tensor(at::kHalf, {5}, 1)},
               {"b", make_tensor(at::kDouble, {3}, 2)},
               {"c", make_tensor(at::kFloat, {7}, 3)},
               {"d", make_tensor(at::kBool, {9}, 4)}};
  save(dir / "s", sd);
  const Manifest m = read_manifest(dir / "s");
  ASSERT_EQ(m.files.size(), 1u);
  const format::Header h = format::read_header(dir / "s" / m.files[0].name);
  EXPECT_EQ(h.data_offset % 4096, 0u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.metadata.at("tsnap_id"), m.id);
  // Element size descending, then name; no holes.
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.tensors[0].name, "b");
  EXPECT_EQ(h.tensors[1].name, "c");
  EXPECT_EQ(h.tensors[2].name, "a");
  EXPECT_EQ(h.tensors[3].name, "d");
  EXPECT_EQ(h.tensors[0].begin, 0u);
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    EXPECT_EQ(h.tensors[i].begin, h.tensors[i - 1].end);
  }
  EXPECT_EQ(std::filesystem::file_size(dir / "s" / m.files[0].name),
            h.data_offset + h.tensors.back().end);
  // The manifest's weight_map names the shard of every tensor.
  std::ifstream in(dir / "s" / "MANIFEST.json");
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["weight_map"]["a"], m.files[0].name);
}

TEST(SaveLoad, EveryShardOpensWithAnIndependentSafetensorsReader) {
  if (!test_support::have_python()) GTEST_SKIP() << "python3 is not installed";
  TempDir dir;
  save(dir / "s", test_support::mixed_state(), {}, {.dtype = at::kBFloat16, .num_shards = 3});
  const Manifest m = read_manifest(dir / "s");
  ASSERT_EQ(m.files.size(), 3u);
  for (const FileRecord& f : m.files) {
    const test_support::ReaderRun run = test_support::run_reference_reader(dir / "s" / f.name);
    EXPECT_EQ(run.status, 0) << f.name << ":\n" << run.output;
  }
}

TEST(SaveLoad, PrecisionConversionMatchesLibTorch) {
  TempDir dir;
  at::Tensor f = make_tensor(at::kFloat, {1000}, 5);
  f[0] = std::numeric_limits<float>::quiet_NaN();
  f[1] = std::numeric_limits<float>::infinity();
  f[2] = -0.0f;
  f[3] = 3.0e38f;  // rounds to inf in fp16
  const at::Tensor d = make_tensor(at::kDouble, {100}, 6);
  const at::Tensor i = make_tensor(at::kLong, {10}, 7);
  const at::Tensor b = make_tensor(at::kBool, {10}, 8);
  StateDict sd{{"f", f}, {"d", d}, {"i", i}, {"b", b}};
  for (at::ScalarType want : {at::kBFloat16, at::kHalf}) {
    const std::string name = std::string("s") + c10::toString(want);
    save(dir / name, sd, {}, {.dtype = want});
    const StateDict back = load(dir / name);
    EXPECT_TRUE(bitwise_equal(back.at("f"), f.to(want))) << name;
    EXPECT_TRUE(bitwise_equal(back.at("d"), d.to(want))) << name;
    EXPECT_TRUE(bitwise_equal(back.at("i"), i));  // integers never convert
    EXPECT_TRUE(bitwise_equal(back.at("b"), b));
    const Manifest m = read_manifest(dir / name);
    EXPECT_EQ(m.find("f")->dtype, want);
    EXPECT_EQ(m.find("f")->source_dtype, at::kFloat);
    EXPECT_EQ(m.find("i")->dtype, at::kLong);
  }
}

TEST(SaveLoad, PerEntryDtypeWinsOverTheOption) {
  TempDir dir;
  StateDict sd;
  sd.insert("keep", make_tensor(at::kFloat, {10}, 1), at::kFloat);
  sd.insert("half", make_tensor(at::kFloat, {10}, 2));
  save(dir / "s", sd, {}, {.dtype = at::kHalf});
  const Manifest m = read_manifest(dir / "s");
  EXPECT_EQ(m.find("keep")->dtype, at::kFloat);
  EXPECT_EQ(m.find("half")->dtype, at::kHalf);
}

TEST(SaveLoad, PartialLoadByGlob) {
  TempDir dir;
  StateDict sd{{"enc.w", make_tensor(at::kFloat, {4}, 1)},
               {"enc.b", make_tensor(at::kFloat, {4}, 2)},
               {"dec.w", make_tensor(at::kFloat, {4}, 3)}};
  save(dir / "s", sd);
  EXPECT_EQ(load(dir / "s", {.include = {"enc.*"}}).keys(),
            (std::vector<std::string>{"enc.b", "enc.w"}));
  EXPECT_EQ(load(dir / "s", {.exclude = {"*.b"}}).keys(),
            (std::vector<std::string>{"dec.w", "enc.w"}));
}

TEST(SaveLoad, ShardSpecsRoundTripAndBadOnesAreRefused) {
  TempDir dir;
  StateDict sd;
  sd.insert("w", make_tensor(at::kFloat, {2, 5}, 1), {}, ShardSpec{{8, 5}, {4, 0}});
  save(dir / "s", sd);
  const StateDict back = load(dir / "s");
  ASSERT_TRUE(back.entry("w").shard.has_value());
  EXPECT_EQ(*back.entry("w").shard, (ShardSpec{{8, 5}, {4, 0}}));
  StateDict bad;
  bad.insert("w", make_tensor(at::kFloat, {2, 5}, 1), {}, ShardSpec{{8, 5}, {7, 0}});
  EXPECT_THROW(save(dir / "bad", bad), InvalidArgument);
  StateDict rank;
  rank.insert("w", make_tensor(at::kFloat, {2, 5}, 1), {}, ShardSpec{{8}, {0}});
  EXPECT_THROW(save(dir / "rank", rank), InvalidArgument);
}

TEST(SaveLoad, EmptyState) {
  TempDir dir;
  save(dir / "s", StateDict{});
  EXPECT_TRUE(load(dir / "s").empty());
  EXPECT_TRUE(verify(dir / "s").empty());
}

TEST(SaveLoad, ExistingNameNeedsOverwrite) {
  TempDir dir;
  StateDict one{{"x", at::ones({3})}};
  StateDict two{{"x", at::full({3}, 2.0)}};
  save(dir / "s", one);
  try {
    save(dir / "s", two);
    FAIL() << "expected kAlreadyExists";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists);
  }
  EXPECT_TRUE(bitwise_equal(load(dir / "s").at("x"), at::ones({3})));
  save(dir / "s", two, {}, {.overwrite = true});
  EXPECT_TRUE(bitwise_equal(load(dir / "s").at("x"), at::full({3}, 2.0)));
  // Only the snapshot remains: the replaced one and the temporary are gone.
  EXPECT_EQ(test_support::dir_entries(dir.path()), std::vector<std::string>{"s"});
}

// Overwrite replaces snapshots only: a directory tsnap did not write (another tool's checkpoint)
// is never swapped away and deleted.
TEST(SaveLoad, OverwriteRefusesADirectoryThatIsNotASnapshot) {
  TempDir dir;
  std::filesystem::create_directories(dir / "other");
  std::ofstream(dir / "other" / "model.pt") << "not tsnap's";
  for (bool snapshotter : {false, true}) {
    try {
      if (snapshotter) {
        Snapshotter snap({.root = dir.path()});
        snap.save_async("other", StateDict{{"x", at::ones({3})}}, {}, {.overwrite = true}).wait();
      } else {
        save(dir / "other", StateDict{{"x", at::ones({3})}}, {}, {.overwrite = true});
      }
      ADD_FAILURE() << "replaced a directory that is not a snapshot";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists) << e.what();
      EXPECT_NE(std::string(e.what()).find("is not a tsnap snapshot"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "other" / "model.pt"));
  EXPECT_EQ(test_support::dir_entries(dir.path()), std::vector<std::string>{"other"});
  // An empty directory holds nothing to lose (a directory made for the checkpoint beforehand).
  std::filesystem::create_directories(dir / "empty");
  save(dir / "empty", StateDict{{"x", at::ones({3})}}, {}, {.overwrite = true});
  EXPECT_TRUE(bitwise_equal(load(dir / "empty").at("x"), at::ones({3})));
}

// A file named MANIFEST.json does not make a snapshot: overwrite replaces a directory only
// when its manifest reads and its checksum holds.
TEST(SaveLoad, OverwriteRefusesADirectoryWhoseManifestIsNotTsnaps) {
  TempDir dir;
  std::filesystem::create_directories(dir / "mine");
  std::ofstream(dir / "mine" / "MANIFEST.json") << "{\"my\": \"notes\"}";
  std::ofstream(dir / "mine" / "weights.bin") << "keep me";
  for (bool snapshotter : {false, true}) {
    try {
      if (snapshotter) {
        Snapshotter snap({.root = dir.path()});
        snap.save_async("mine", StateDict{{"x", at::ones({3})}}, {}, {.overwrite = true}).wait();
      } else {
        save(dir / "mine", StateDict{{"x", at::ones({3})}}, {}, {.overwrite = true});
      }
      ADD_FAILURE() << "replaced a directory whose MANIFEST.json is not a snapshot's";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists) << e.what();
      EXPECT_NE(std::string(e.what()).find("is not a tsnap snapshot"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "mine" / "weights.bin"));
  // A snapshot whose manifest was edited (its checksum fails) is not replaced either.
  save(dir / "s", StateDict{{"x", at::ones({3})}});
  test_support::flip_byte(dir / "s" / "MANIFEST.json", 30);
  EXPECT_THROW(save(dir / "s", StateDict{{"x", at::zeros({3})}}, {}, {.overwrite = true}), Error);
}

TEST(SaveLoad, BadInputIsRejectedBeforeAnythingIsWritten) {
  TempDir dir;
  StateDict sd;
  sd.insert("x", at::ones({2}));
  EXPECT_THROW(save(dir / "s", sd, {}, {.dtype = at::kInt}), InvalidArgument);
  StateDict complex;
  complex.insert("c", at::ones({2}, at::kComplexFloat));
  EXPECT_THROW(save(dir / "c", complex), InvalidArgument);
  EXPECT_TRUE(test_support::dir_entries(dir.path()).empty());
}

TEST(Verify, FlippedByteNamesTheChunkAndLoadRefuses) {
  TempDir dir;
  StateDict sd{{"w", make_tensor(at::kFloat, {1 << 20}, 1)}};  // 4 MiB: 4 chunks of 1 MiB
  save(dir / "s", sd, {}, {.chunk_bytes = 1 << 20});
  const Manifest m = read_manifest(dir / "s");
  test_support::flip_byte(dir / "s" / m.files[0].name, 4096 + (2 << 20) + 5);
  const auto bad = verify(dir / "s");
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].file, m.files[0].name);
  EXPECT_EQ(bad[0].chunk, 2u);
  try {
    load(dir / "s");
    FAIL() << "expected a hash mismatch";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kHashMismatch);
    EXPECT_NE(std::string(e.what()).find("chunk 2"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(load(dir / "s", {.verify = false}));
}

TEST(Verify, TruncatedShard) {
  TempDir dir;
  save(dir / "s", StateDict{{"w", make_tensor(at::kFloat, {5000}, 1)}});
  const Manifest m = read_manifest(dir / "s");
  const auto shard = dir / "s" / m.files[0].name;
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 10);
  EXPECT_FALSE(verify(dir / "s").empty());
  try {
    load(dir / "s");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTruncated);
  }
}

TEST(Verify, MissingManifestIsNotASnapshot) {
  TempDir dir;
  save(dir / "s", StateDict{{"w", at::ones({3})}});
  std::filesystem::remove(dir / "s" / "MANIFEST.json");
  try {
    load(dir / "s");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
  const auto listed = list(dir.path());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].committed);
  EXPECT_FALSE(latest(dir.path()).has_value());
}

TEST(Catalog, LatestPrefersHighestStepAndSkipsBrokenOnes) {
  TempDir dir;
  save(dir / "a", StateDict{{"w", at::ones({1})}}, {{"step", 200}});
  save(dir / "b", StateDict{{"w", at::ones({1})}}, {{"step", 100}});
  save(dir / "c", StateDict{{"w", at::ones({1})}}, {{"step", 300}});
  std::filesystem::remove(dir / "c" / "MANIFEST.json");   // corrupt: skipped
  std::filesystem::create_directory(dir / ".d.tmp-123");  // unfinished save: skipped
  EXPECT_EQ(latest(dir.path()), dir / "a");
  const auto all = list(dir.path());
  EXPECT_EQ(all.size(), 4u);
}

}  // namespace
}  // namespace tsnap
