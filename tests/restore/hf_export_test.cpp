// tsnap::export_hf: the Hugging Face layout read back with the independent reference reader
// (tests/format/safetensors_reader.py) and byte for byte against tsnap::load: one file, several
// files plus the index, one object of a checkpoint, a dtype conversion, an existing output.

#include "tsnap/hf_export.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "format/safetensors.h"
#include "support/test_util.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/save.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_support::bitwise_equal;
using test_support::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every tensor of a safetensors file (parsed with tsnap's own reader of the format) plus its
// `__metadata__`; the reference reader must accept the file too, with tsnap's layout rules.
StateDict read_file(const fs::path& path, std::map<std::string, std::string>* metadata) {
  if (test_support::have_python()) {
    const test_support::ReaderRun run = test_support::run_reference_reader(path);
    EXPECT_EQ(run.status, 0) << path << ": " << run.output;
  }
  const format::Header h = format::read_header(path);
  if (metadata != nullptr) *metadata = h.metadata;
  const std::string bytes = slurp(path);
  StateDict out;
  for (const format::HeaderTensor& t : h.tensors) {
    at::Tensor v = at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
    if (t.end > t.begin) {  // an empty tensor's data_ptr may be null
      std::memcpy(v.data_ptr(), bytes.data() + h.data_offset + t.begin, t.end - t.begin);
    }
    out.insert(t.name, v);
  }
  return out;
}

void expect_same(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& [key, e] : a) EXPECT_TRUE(bitwise_equal(e.tensor, b.at(key))) << key;
}

TEST(HfExport, OneFileHoldsEveryTensorBitForBit) {
  TempDir dir;
  const StateDict state = test_support::mixed_state(3);
  save(dir / "snap", state);
  const HfExportResult r = export_hf(dir / "snap", dir / "hf", {.link = false});
  EXPECT_FALSE(r.linked);
  EXPECT_EQ(r.files, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(test_support::dir_entries(dir / "hf"), r.files);  // no index, no leftovers
  EXPECT_EQ(r.tensors, state.size());
  std::map<std::string, std::string> metadata;
  expect_same(read_file(dir / "hf" / "model.safetensors", &metadata), load(dir / "snap"));
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  // Nothing but the output next to it: the temporary directory is gone.
  EXPECT_EQ(test_support::dir_entries(dir.path()), (std::vector<std::string>{"hf", "snap"}));
}

// A snapshot whose shards can serve as they are is exported as hard links: same inodes, the
// same bytes, readable by the reference reader, and still there once the snapshot is deleted.
TEST(HfExport, LinksTheShardsWhenTheyServeAsTheyAre) {
  TempDir dir;
  const StateDict state = test_support::mixed_state(3);
  save(dir / "snap", state, nlohmann::json::object(), {.num_shards = 3});
  const Manifest m = read_manifest(dir / "snap");
  ASSERT_EQ(m.files.size(), 3u);
  const HfExportResult r = export_hf(dir / "snap", dir / "hf");
  EXPECT_TRUE(r.linked);
  EXPECT_EQ(r.files, (std::vector<std::string>{
                         "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                         "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  EXPECT_EQ(r.tensors, state.size());
  const json index = json::parse(slurp(dir / "hf" / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], r.total_size);
  StateDict all;
  for (size_t i = 0; i < 3; ++i) {
    const fs::path out = dir / "hf" / r.files[i];
    EXPECT_TRUE(fs::equivalent(out, dir / "snap" / m.files[i].name)) << out;
    std::map<std::string, std::string> metadata;
    for (const auto& [key, e] : read_file(out, &metadata)) {
      EXPECT_EQ(index["weight_map"][key], r.files[i]) << key;
      all.insert(key, e.tensor);
    }
    EXPECT_EQ(metadata.at("format"), "pt");
  }
  EXPECT_EQ(index["weight_map"].size(), state.size());
  const StateDict loaded = load(dir / "snap");
  expect_same(all, loaded);
  fs::remove_all(dir / "snap");
  EXPECT_EQ(read_file(dir / "hf" / r.files[0], nullptr).size() > 0, true);

  // A dtype change, or link off, writes copies.
  save(dir / "snap2", state);
  EXPECT_FALSE(export_hf(dir / "snap2", dir / "hf2", {.dtype = at::kBFloat16}).linked);
  EXPECT_FALSE(export_hf(dir / "snap2", dir / "hf3", {.link = false}).linked);
}

TEST(HfExport, ACorruptSnapshotIsNotLinked) {
  TempDir dir;
  save(dir / "snap", test_support::mixed_state(3));
  const Manifest m = read_manifest(dir / "snap");
  const fs::path shard = dir / "snap" / m.files[0].name;
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(m.files[0].data_offset + 1);
    f.seekg(at);
    const char c = static_cast<char>(f.get());
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  try {
    export_hf(dir / "snap", dir / "hf");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kHashMismatch);
    EXPECT_NE(std::string(e.what()).find(m.files[0].name), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "hf"));
  EXPECT_EQ(test_support::dir_entries(dir.path()), (std::vector<std::string>{"snap"}));
}

TEST(HfExport, SplitsIntoFilesWithAnIndex) {
  TempDir dir;
  StateDict state;
  for (int i = 0; i < 7; ++i) {
    state.insert("layer" + std::to_string(i) + ".weight",
                 test_support::make_tensor(at::kFloat, {10, 25}, i));  // 1000 bytes each
  }
  state.insert("step", test_support::make_tensor(at::kLong, {3}, 9));
  save(dir / "snap", state);
  const HfExportResult r = export_hf(dir / "snap", dir / "hf", {.max_shard_size = 2500});
  const std::vector<std::string> shards = {
      "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
      "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"};
  std::vector<std::string> expected = shards;
  expected.push_back("model.safetensors.index.json");
  EXPECT_EQ(r.files, expected);
  EXPECT_EQ(r.total_size, 7 * 1000 + 24u);

  const json index = json::parse(slurp(dir / "hf" / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], r.total_size);
  ASSERT_EQ(index["weight_map"].size(), state.size());
  StateDict all;
  for (const std::string& f : shards) {
    const StateDict part = read_file(dir / "hf" / f, nullptr);
    EXPECT_LE(part.nbytes(), 2500u) << f;
    for (const auto& [key, e] : part) {
      EXPECT_EQ(index["weight_map"][key], f) << key;
      all.insert(key, e.tensor);
    }
  }
  expect_same(all, state);
}

TEST(HfExport, OneObjectOfACheckpointConvertedToBf16) {
  TempDir dir;
  StateDict state;
  state.insert("model/fc1.weight", test_support::make_tensor(at::kFloat, {4, 6}, 1));
  state.insert("model/fc1.bias", test_support::make_tensor(at::kDouble, {4}, 2));
  state.insert("model/num_batches", test_support::make_tensor(at::kLong, {}, 3));
  state.insert("optimizer/fc1.weight.exp_avg", test_support::make_tensor(at::kFloat, {4, 6}, 4));
  save(dir / "snap", state);
  const HfExportResult r =
      export_hf(dir / "snap", dir / "hf", {.object = "model", .dtype = at::kBFloat16});
  EXPECT_EQ(r.tensors, 3u);
  const StateDict out = read_file(dir / "hf" / "model.safetensors", nullptr);
  ASSERT_EQ(out.keys(), (std::vector<std::string>{"fc1.bias", "fc1.weight", "num_batches"}));
  EXPECT_TRUE(bitwise_equal(out.at("fc1.weight"), state.at("model/fc1.weight").to(at::kBFloat16)));
  EXPECT_TRUE(bitwise_equal(out.at("fc1.bias"), state.at("model/fc1.bias").to(at::kBFloat16)));
  EXPECT_TRUE(bitwise_equal(out.at("num_batches"), state.at("model/num_batches")));  // kept

  // An object that is not there names the objects there are; nothing is written.
  try {
    export_hf(dir / "snap", dir / "none", {.object = "modle"});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.code(), ErrorCode::kKeyNotFound);
    EXPECT_NE(std::string(e.what()).find("its objects: model, optimizer"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "none"));
  EXPECT_THROW(export_hf(dir / "snap", dir / "int", {.dtype = at::kLong}), InvalidArgument);
}

// A checkpoint of several objects is not a model: without `object` the export is refused,
// naming the objects (transformers would otherwise find no weight it knows).
TEST(HfExport, ACheckpointOfSeveralObjectsNeedsAnObject) {
  TempDir dir;
  StateDict state;
  state.insert("model/fc1.weight", test_support::make_tensor(at::kFloat, {4, 6}, 1));
  state.insert("optim/fc1.weight/exp_avg", test_support::make_tensor(at::kFloat, {4, 6}, 2));
  save(dir / "snap", state);
  try {
    export_hf(dir / "snap", dir / "hf");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("2 objects (model, optim)"), std::string::npos) << what;
    EXPECT_NE(what.find("--object model"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(dir / "hf"));
}

// Replacing the output never removes the input: an output that is, lies inside or holds the
// snapshot is refused, whatever overwrite says.
TEST(HfExport, RefusesAnOutputThatIsInsideOrHoldsTheSnapshot) {
  TempDir dir;
  fs::create_directories(dir / "root");
  save(dir / "root" / "s", StateDict{{"w", at::ones({3})}});
  for (const fs::path& out : {dir / "root" / "s", dir / "root" / "s" / "hf", dir / "root",
                              dir / "root" / "." / "s" / ".." / "s"}) {
    try {
      export_hf(dir / "root" / "s", out, {.overwrite = true});
      ADD_FAILURE() << "no error for " << out;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("choose an output outside it"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(verify(dir / "root" / "s").empty());
  EXPECT_TRUE(bitwise_equal(load(dir / "root" / "s").at("w"), at::ones({3})));
}

TEST(HfExport, RefusesAnExistingOutputUnlessOverwrite) {
  TempDir dir;
  save(dir / "a", StateDict{{"w", at::ones({3})}});
  save(dir / "b", StateDict{{"v", at::zeros({2})}});
  export_hf(dir / "a", dir / "hf");
  try {
    export_hf(dir / "b", dir / "hf");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists);
  }
  EXPECT_EQ(read_file(dir / "hf" / "model.safetensors", nullptr).keys(),
            std::vector<std::string>{"w"});
  export_hf(dir / "b", dir / "hf", {.overwrite = true});
  EXPECT_EQ(read_file(dir / "hf" / "model.safetensors", nullptr).keys(),
            std::vector<std::string>{"v"});
  EXPECT_EQ(test_support::dir_entries(dir.path()), (std::vector<std::string>{"a", "b", "hf"}));
}

// --overwrite replaces only what an export may replace: never a user's files or a file.
TEST(HfExport, OverwriteRefusesADirectoryOfUserFilesAndAFile) {
  TempDir dir;
  save(dir / "s", StateDict{{"w", at::ones({3})}});
  fs::create_directories(dir / "mine");
  std::ofstream(dir / "mine" / "notes.txt") << "my notes";
  std::ofstream(dir / "mine" / "model.safetensors") << "not an export";  // beside notes.txt
  std::ofstream(dir / "file.txt") << "a file";
  for (const fs::path& out : {dir / "mine", dir / "file.txt"}) {
    try {
      export_hf(dir / "s", out, {.overwrite = true});
      ADD_FAILURE() << "replaced " << out;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists) << e.what();
      EXPECT_NE(std::string(e.what()).find("overwrite replaces only"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(slurp(dir / "mine" / "notes.txt"), "my notes");
  EXPECT_EQ(slurp(dir / "file.txt"), "a file");
  EXPECT_EQ(test_support::dir_entries(dir.path()),
            (std::vector<std::string>{"file.txt", "mine", "s"}));
}

// It does replace an empty directory, an earlier export (split into files too) and a snapshot.
TEST(HfExport, OverwriteReplacesAnEmptyDirectoryAnEarlierExportAndASnapshot) {
  TempDir dir;
  save(dir / "s", StateDict{{"w", at::ones({3})}, {"v", at::zeros({1000})}});
  save(dir / "old", StateDict{{"x", at::ones({2})}});
  fs::create_directories(dir / "empty");
  export_hf(dir / "s", dir / "split", {.max_shard_size = 100});
  ASSERT_TRUE(fs::exists(dir / "split" / "model.safetensors.index.json"));
  for (const char* out : {"empty", "split", "old"}) {
    export_hf(dir / "s", dir / out, {.overwrite = true});
    EXPECT_EQ(read_file(dir / out / "model.safetensors", nullptr).keys(),
              (std::vector<std::string>{"v", "w"}))
        << out;
  }
}

}  // namespace
}  // namespace tsnap
