// The read path of tsnap::load and tsnap::load_into, run once per engine (pread pool and
// io_uring) and per I/O mode (buffered, O_DIRECT): round trips, partial loads, dtype
// up-conversion, tiny read budgets, and failures in the middle of the stream.

#include "tsnap/load.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "io/engine.h"
#include "io/fault_engine.h"
#include "restore/restore_util.h"
#include "support/on_engine.h"
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

struct Mode {
  const char* name;
  EngineKind engine;
  bool direct;
};

class LoadPath : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    if (GetParam().direct && !test_support::direct_io_works(dir_.path())) {
      GTEST_SKIP() << "O_DIRECT is not supported under " << dir_.path();
    }
    if (GetParam().engine == EngineKind::kUring) {
      try {
        StateDict probe{{"x", at::ones({1})}};
        save(dir_ / "probe", probe);
        load(dir_ / "probe", options());
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kUnsupported) GTEST_SKIP() << e.what();
        throw;
      }
    }
  }

  LoadOptions options() const {
    LoadOptions o;
    o.engine = GetParam().engine;
    o.direct_io = GetParam().direct;
    return o;
  }

  // Saves `sd` as `name` and drops it from the page cache, so the direct mode reads O_DIRECT.
  std::filesystem::path saved(const std::string& name, const StateDict& sd,
                              const SaveOptions& so = {}) {
    save(dir_ / name, sd, {}, so);
    test_support::evict(dir_ / name);
    return dir_ / name;
  }

  void expect_engine(const LoadReport& r) const {
    EXPECT_EQ(has(r.engine, "O_DIRECT"), GetParam().direct) << r.engine;
    EXPECT_EQ(has(r.engine, "io_uring"), GetParam().engine == EngineKind::kUring) << r.engine;
  }

  TempDir dir_;
};

// Four 8 KiB tensors in one shard with 8 KiB chunks: the header fills half of chunk 0, so
// chunk c holds the end of tensor c-1 and the start of tensor c.
StateDict four_chunked_tensors() {
  StateDict sd;
  const char* names[] = {"w.1st", "w.2nd", "w.3rd", "w.4th"};
  for (int i = 0; i < 4; ++i) sd.insert(names[i], make_tensor(at::kFloat, {2048}, 10 + i));
  return sd;
}
const SaveOptions kFourChunks = {.num_shards = 1, .chunk_bytes = 8192};

TEST_P(LoadPath, FullRoundTripOfEveryDtypeAcrossShardsAndChunks) {
  StateDict sd = test_support::mixed_state(3);
  sd.insert("big", make_tensor(at::kFloat, {300, 1000}, 4));  // many chunks
  const auto path = saved("s", sd, {.num_shards = 3, .chunk_bytes = 64 << 10});
  const StateDict back = load(path, options());
  EXPECT_TRUE(same_state(sd, back));

  StateDict dest = test_support::filled_like(sd, 0);
  const void* before = dest.at("big").data_ptr();
  test_support::evict(path);
  const LoadReport r = load_into(path, dest, options());
  EXPECT_TRUE(same_state(sd, dest));
  EXPECT_EQ(dest.at("big").data_ptr(), before);  // in place
  EXPECT_EQ(r.loaded, sd.keys());
  EXPECT_TRUE(r.not_in_destination.empty());
  EXPECT_GE(r.bytes_read, sd.at("big").nbytes());
  expect_engine(r);
}

// A manifest paired with another snapshot's shards (same names, sizes and layout, so only the
// shards' tsnap_id tells them apart) is refused by load, load_into, open and verify.
TEST_P(LoadPath, ShardsOfAnotherSnapshotAreRefused) {
  StateDict sd = four_chunked_tensors();
  const auto a = saved("a", sd, kFourChunks);
  for (auto& [k, e] : sd) e.tensor.add_(1);
  const auto b = saved("b", sd, kFourChunks);
  for (const auto& entry : std::filesystem::directory_iterator(b)) {
    if (entry.path().extension() == ".safetensors") {
      std::filesystem::copy_file(entry.path(), a / entry.path().filename(),
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }
  for (const std::string& what :
       {error_of([&] { load(a, options()); }, ErrorCode::kBadManifest),
        error_of(
            [&] {
              StateDict dest = test_support::filled_like(sd, 0);
              load_into(a, dest, options());
            },
            ErrorCode::kBadManifest),
        error_of([&] { open(a).read("w.1st"); }, ErrorCode::kBadManifest)}) {
    EXPECT_TRUE(has(what, "from different snapshots")) << what;
  }
  const std::vector<BadChunk> bad = verify(a);
  ASSERT_FALSE(bad.empty());
  for (const BadChunk& c : bad)
    EXPECT_TRUE(has(c.problem, "from different snapshots")) << c.problem;
  EXPECT_TRUE(same_state(sd, load(b, options())));
}

TEST_P(LoadPath, PartialLoadsReadOnlyTheSelectedKeys) {
  StateDict sd{{"enc.w", make_tensor(at::kFloat, {64, 64}, 1)},
               {"enc.b", make_tensor(at::kFloat, {64}, 2)},
               {"dec.w", make_tensor(at::kHalf, {64, 64}, 3)},
               {"dec.b", make_tensor(at::kHalf, {64}, 4)}};
  const auto path = saved("s", sd, {.num_shards = 2, .chunk_bytes = 8192});
  LoadOptions o = options();
  o.include = {"enc.*"};
  EXPECT_TRUE(
      same_state(load(path, o), StateDict{{"enc.b", sd.at("enc.b")}, {"enc.w", sd.at("enc.w")}}));

  StateDict dest = test_support::filled_like(sd, 0);
  const StateDict zeros = clone(dest);
  o.include.clear();
  o.exclude = {"*.w"};
  const LoadReport r = load_into(path, dest, o);
  EXPECT_EQ(r.loaded, (std::vector<std::string>{"dec.b", "enc.b"}));
  EXPECT_TRUE(bitwise_equal(dest.at("enc.b"), sd.at("enc.b")));
  EXPECT_TRUE(bitwise_equal(dest.at("dec.b"), sd.at("dec.b")));
  EXPECT_TRUE(bitwise_equal(dest.at("enc.w"), zeros.at("enc.w")));  // not selected
  EXPECT_TRUE(bitwise_equal(dest.at("dec.w"), zeros.at("dec.w")));
  EXPECT_LT(r.bytes_read, 3 * 8192u);  // the two biases lie in the shards' last chunks

  // Without verification only the blocks under the selected tensors are read.
  o.exclude.clear();
  o.include = {"enc.b"};
  o.verify = false;
  StateDict bias{{"enc.b", at::zeros({64})}};
  EXPECT_EQ(load_into(path, bias, o).bytes_read, 4096u);
  EXPECT_TRUE(bitwise_equal(bias.at("enc.b"), sd.at("enc.b")));
}

TEST_P(LoadPath, LoadIntoConvertsBf16AndHalfUpToTheDestinationDtype) {
  // Saved as bf16 (a 2 MB tensor spans many chunks); loaded into fp32 and fp64 parameters.
  StateDict sd{{"w", make_tensor(at::kFloat, {1000, 500}, 1)},
               {"h", make_tensor(at::kHalf, {777}, 2)},
               {"i", make_tensor(at::kLong, {33}, 3)}};
  const auto path = saved("s", sd, {.dtype = at::kBFloat16, .chunk_bytes = 64 << 10});
  const StateDict stored = load(path, options());
  ASSERT_EQ(stored.at("w").scalar_type(), at::kBFloat16);

  StateDict dest{{"w", at::zeros({1000, 500}, at::kFloat)},
                 {"h", at::zeros({777}, at::kDouble)},
                 {"i", at::zeros({33}, at::kLong)}};
  load_into(path, dest, options());
  EXPECT_TRUE(bitwise_equal(dest.at("w"), stored.at("w").to(at::kFloat)));
  EXPECT_TRUE(bitwise_equal(dest.at("h"), stored.at("h").to(at::kDouble)));
  EXPECT_TRUE(bitwise_equal(dest.at("i"), sd.at("i")));
  // And back down: bf16 on disk into an fp16 destination rounds as Tensor::to does.
  StateDict half{{"w", at::zeros({1000, 500}, at::kHalf)}};
  load_into(path, half, options());
  EXPECT_TRUE(bitwise_equal(half.at("w"), stored.at("w").to(at::kHalf)));
}

TEST_P(LoadPath, NewTensorsKeepTheirValuesWhenTheOthersAreGone) {
  // Each new tensor owns its memory, whatever the others do; a selective load returns only
  // the keys asked for.
  const StateDict sd = four_chunked_tensors();
  const auto path = saved("s", sd, kFourChunks);
  at::Tensor third;
  {
    const StateDict back = load(path, options());
    third = back.at("w.3rd");
  }
  EXPECT_TRUE(bitwise_equal(third, sd.at("w.3rd")));
  third.add_(1);  // writable like any tensor
  LoadOptions one = options();
  one.include = {"w.2nd"};
  const StateDict part = load(path, one);
  EXPECT_EQ(part.size(), 1u);
  EXPECT_TRUE(bitwise_equal(part.at("w.2nd"), sd.at("w.2nd")));
}

TEST_P(LoadPath, ABudgetSmallerThanAChunkStillReadsOneChunkAtATime) {
  const StateDict sd = four_chunked_tensors();
  const auto path = saved("s", sd, kFourChunks);
  LoadOptions o = options();
  o.read_budget_bytes = 1;
  StateDict dest = test_support::filled_like(sd, 0);
  load_into(path, dest, o);
  EXPECT_TRUE(same_state(sd, dest));
  EXPECT_TRUE(same_state(sd, load(path, o)));
}

TEST_P(LoadPath, HashMismatchMidStreamNamesTheTensorsAlreadyWritten) {
  const StateDict sd = four_chunked_tensors();
  const auto path = saved("s", sd, kFourChunks);
  const Manifest m = read_manifest(path);
  test_support::flip_byte(path / m.files[0].name, 3 * 8192 + 5);  // chunk 3: 3rd and 4th tensors
  StateDict dest = test_support::filled_like(sd, 0);
  LoadOptions o = options();
  o.read_budget_bytes = 8192;  // one chunk in flight: the order of writes is known
  const std::string what = error_of([&] { load_into(path, dest, o); }, ErrorCode::kHashMismatch);
  EXPECT_TRUE(has(what, m.files[0].name) && has(what, "chunk 3")) << what;
  // The failed chunk was hashed and copied piece by piece (read_chunks.h): its targets count
  // as written, and the ones after it are not.
  EXPECT_TRUE(has(what,
                  "4 of 4 destination tensors were already written: w.1st, w.2nd, "
                  "w.3rd, w.4th (partly)"))
      << what;
  EXPECT_TRUE(bitwise_equal(dest.at("w.1st"), sd.at("w.1st")));
  EXPECT_TRUE(bitwise_equal(dest.at("w.2nd"), sd.at("w.2nd")));
  EXPECT_TRUE(bitwise_equal(dest.at("w.4th").narrow(0, 1024, 1024), at::zeros({1024})));
}

TEST_P(LoadPath, AtomicLoadChangesNothingOnAHashMismatch) {
  const StateDict sd = four_chunked_tensors();
  const auto path = saved("s", sd, kFourChunks);
  const Manifest m = read_manifest(path);
  test_support::flip_byte(path / m.files[0].name, 4 * 8192 + 5);  // the last chunk
  StateDict dest = test_support::filled_like(sd, 7);
  const StateDict before = clone(dest);
  LoadOptions o = options();
  o.atomic = true;
  const std::string what = error_of([&] { load_into(path, dest, o); }, ErrorCode::kHashMismatch);
  EXPECT_TRUE(has(what, "chunk 4")) << what;
  EXPECT_FALSE(has(what, "already written")) << what;
  EXPECT_TRUE(same_state(before, dest));
  // Without verification the same load goes through.
  o.verify = false;
  load_into(path, dest, o);
  EXPECT_TRUE(bitwise_equal(dest.at("w.1st"), sd.at("w.1st")));
}

TEST_P(LoadPath, ReadErrorMidStreamNamesFileOffsetAndWrittenTensors) {
  const StateDict sd = four_chunked_tensors();
  const auto path = saved("s", sd, kFourChunks);
  const Manifest m = read_manifest(path);
  LoadOptions o = options();
  o.read_budget_bytes = 8192;
  const auto faulty = [] {
    return std::make_shared<io::FaultInjectingEngine>(io::make_pwrite_engine(1),
                                                      io::Faults{.fail_read = 3});
  };
  StateDict dest = test_support::filled_like(sd, 0);
  std::string what =
      error_of([&] { test_support::on_engine(faulty(), [&] { load_into(path, dest, o); }); },
               ErrorCode::kIo);
  EXPECT_TRUE(has(what, m.files[0].name) && has(what, "chunk 2 at offset 16384")) << what;
  EXPECT_TRUE(has(what, "2 of 4 destination tensors were already written: w.1st, w.2nd (partly)"))
      << what;

  // Atomic: the same failure leaves the destination untouched.
  o.atomic = true;
  o.read_budget_bytes = 1 << 20;
  StateDict fresh = test_support::filled_like(sd, 5);
  const StateDict before = clone(fresh);
  error_of([&] { test_support::on_engine(faulty(), [&] { load_into(path, fresh, o); }); },
           ErrorCode::kIo);
  EXPECT_TRUE(same_state(before, fresh));
}

INSTANTIATE_TEST_SUITE_P(Engines, LoadPath,
                         ::testing::Values(Mode{"pread", EngineKind::kPwrite, false},
                                           Mode{"pread_direct", EngineKind::kPwrite, true},
                                           Mode{"io_uring", EngineKind::kUring, false},
                                           Mode{"io_uring_direct", EngineKind::kUring, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tsnap

namespace tsnap {
namespace {

using test_support::error_of;
using test_support::make_tensor;
using test_support::TempDir;

// A checkpoint-like snapshot: keys under "model/" and "optim/".
StateDict prefixed_state() {
  StateDict sd;
  sd.insert("model/fc1.weight", make_tensor(at::kFloat, {4, 3}, 1));
  sd.insert("model/fc1.bias", make_tensor(at::kFloat, {4}, 2));
  sd.insert("optim/fc1.weight.exp_avg", make_tensor(at::kFloat, {4, 3}, 3));
  return sd;
}

TEST(SelectiveLoad, APatternThatMatchesNothingIsAnErrorNamingTheNearestKeys) {
  TempDir dir;
  save(dir / "s", prefixed_state());
  const std::string e = error_of([&] { load(dir / "s", {.include = {"model/fc1.weights"}}); },
                                 ErrorCode::kKeyNotFound);
  EXPECT_NE(e.find("'model/fc1.weights' matches no key"), std::string::npos) << e;
  EXPECT_NE(e.find("nearest keys: 'model/fc1.weight'"), std::string::npos) << e;
  // Opting out loads what matches, here nothing.
  EXPECT_TRUE(load(dir / "s", {.include = {"model/fc1.weights"}, .allow_unmatched = true}).empty());
}

TEST(SelectiveLoad, ABareKeyThatExistsUnderAPrefixSaysWhichPrefix) {
  TempDir dir;
  save(dir / "s", prefixed_state());
  StateDict dest;
  dest.insert("fc1.weight", at::zeros({4, 3}));
  const std::string e = error_of([&] { load_into(dir / "s", dest); }, ErrorCode::kKeyNotFound);
  EXPECT_NE(e.find("'model/fc1.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("key_prefix = \"model/\""), std::string::npos) << e;
  const std::string p =
      error_of([&] { load(dir / "s", {.include = {"fc1.bias"}}); }, ErrorCode::kKeyNotFound);
  EXPECT_NE(p.find("'model/fc1.bias'"), std::string::npos) << p;
}

TEST(SelectiveLoad, KeyPrefixMapsAnObjectOfACheckpointOntoBareKeys) {
  TempDir dir;
  const StateDict saved = prefixed_state();
  save(dir / "s", saved);
  const StateDict model = load(dir / "s", {.key_prefix = "model/"});
  EXPECT_EQ(model.keys(), (std::vector<std::string>{"fc1.bias", "fc1.weight"}));
  EXPECT_TRUE(test_support::bitwise_equal(model.at("fc1.weight"), saved.at("model/fc1.weight")));

  StateDict dest;
  dest.insert("fc1.weight", at::zeros({4, 3}));
  const LoadReport r = load_into(dir / "s", dest, {.key_prefix = "model/"});
  EXPECT_TRUE(test_support::bitwise_equal(dest.at("fc1.weight"), saved.at("model/fc1.weight")));
  EXPECT_EQ(r.not_in_destination, (std::vector<std::string>{"fc1.bias"}));
  // Made fatal, the unused key is an error and nothing is written.
  dest.set("fc1.weight", at::zeros({4, 3}));
  const std::string e = error_of(
      [&] { load_into(dir / "s", dest, {.key_prefix = "model/", .require_every_key = true}); },
      ErrorCode::kKeyNotFound);
  EXPECT_NE(e.find("fc1.bias"), std::string::npos) << e;
  EXPECT_TRUE(test_support::bitwise_equal(dest.at("fc1.weight"), at::zeros({4, 3})));
  // A prefix no key has.
  EXPECT_THROW(load(dir / "s", {.key_prefix = "modle/"}), InvalidArgument);
}

}  // namespace
}  // namespace tsnap
