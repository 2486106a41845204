// Hostile snapshot directories: FIFOs and symbolic links where files should be, manifests that
// claim more than the files hold, and saves whose metadata or tensors a reader would refuse.
// Each fails with a tsnap error naming the problem: no hang, no foreign exception, nothing
// written.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "restore/restore_util.h"
#include "tsnap/catalog.h"
#include "tsnap/load.h"
#include "tsnap/reader.h"
#include "tsnap/save.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_support::error_of;
using test_support::has;
using test_support::TempDir;

StateDict one_tensor() {
  StateDict sd;
  sd.insert("w", test_support::make_tensor(at::kFloat, {1024}, 3));
  return sd;
}

fs::path only_shard(const fs::path& snapshot) {
  for (const auto& e : fs::directory_iterator(snapshot)) {
    if (e.path().extension() == ".safetensors") return e.path();
  }
  return {};
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

TEST(HostileFiles, AFifoManifestNeitherHangsListingNorLoading) {
  TempDir dir;
  save(dir / "good", one_tensor());
  fs::create_directory(dir / "fifo");
  ASSERT_EQ(::mkfifo((dir / "fifo" / kManifestName).c_str(), 0644), 0);
  const std::vector<Listed> all = list(dir.path());
  ASSERT_EQ(all.size(), 2u);
  for (const Listed& l : all) {
    EXPECT_EQ(l.committed, l.name == "good") << l.name << ": " << l.problem;
  }
  EXPECT_EQ(latest(dir.path())->filename(), "good");
  const std::string what = error_of([&] { load(dir / "fifo"); }, ErrorCode::kUnsafePath);
  EXPECT_TRUE(has(what, "not a regular file")) << what;
}

TEST(HostileFiles, AFifoShardIsRefused) {
  TempDir dir;
  save(dir / "s", one_tensor());
  const fs::path shard = only_shard(dir / "s");
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0644), 0);
  error_of([&] { load(dir / "s"); }, ErrorCode::kUnsafePath);
  error_of([&] { open(dir / "s").read("w"); }, ErrorCode::kUnsafePath);
  EXPECT_FALSE(verify(dir / "s").empty());
}

TEST(HostileFiles, ASymlinkedShardIsRefused) {
  TempDir dir;
  save(dir / "s", one_tensor());
  const fs::path shard = only_shard(dir / "s");
  fs::rename(shard, dir / "elsewhere");
  fs::create_symlink(dir / "elsewhere", shard);
  const std::string what = error_of([&] { load(dir / "s"); }, ErrorCode::kUnsafePath);
  EXPECT_TRUE(has(what, "symbolic link")) << what;
  EXPECT_FALSE(verify(dir / "s").empty());
}

TEST(HostileFiles, AManifestClaimingATerabyteTensorFailsBeforeAllocating) {
  TempDir dir;
  save(dir / "s", one_tensor());
  const fs::path path = dir / "s" / kManifestName;
  json m = read_json(path);
  const std::string file = m["tensors"]["w"]["file"];
  json& f = m["files"][file];
  const uint64_t data_offset = f["data_offset"];
  const uint64_t tib = 1ull << 40;
  f["size"] = data_offset + tib;
  f["chunk_bytes"] = 1ull << 30;
  f["chunk_hashes"] = json::array();
  for (uint64_t c = 0; c < (data_offset + tib + (1ull << 30) - 1) >> 30; ++c) {
    f["chunk_hashes"].push_back("0000000000000000");
  }
  m["tensors"]["w"]["shape"] = {tib / 4};
  m["tensors"]["w"]["offsets"] = {data_offset, data_offset + tib};
  std::ofstream(path) << test_support::signed_manifest_text(m);  // as a hostile writer would
  const std::string what = error_of([&] { load(dir / "s"); }, ErrorCode::kTruncated);
  EXPECT_TRUE(has(what, "the manifest says")) << what;
}

TEST(HostileFiles, SavesRefuseWhatReadersWouldReject) {
  TempDir dir;
  json deep = json::array();
  for (int i = 0; i < 100; ++i) deep = json::array({deep});
  error_of([&] { save(dir / "deep", one_tensor(), {{"x", deep}}); }, ErrorCode::kInvalidArgument);
  error_of(
      [&] {
        save(dir / "utf8", one_tensor(), {{"x", std::string("\xff")}});
      },
      ErrorCode::kInvalidArgument);
  StateDict meta;
  meta.insert("m", at::empty({4}, at::TensorOptions().device(at::kMeta)));
  const std::string what = error_of([&] { save(dir / "meta", meta); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(has(what, "meta")) << what;
  EXPECT_TRUE(test_support::dir_entries(dir.path()).empty());
}

}  // namespace
}  // namespace tsnap
