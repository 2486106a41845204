// The `tsnap` tool on a multi-rank snapshot (label `dist`): 2 ranks save the "sharded" scenario
// of dist_save_test.cpp (replicated tensors written once each, and keys stored as pieces), then
// ls, inspect, verify, cat, diff and consolidate run on it as a user runs them, as processes.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/run_ranks.h"
#include "support/test_util.h"
#include "support/tool_run.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/save.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::TempDir;
using test_support::ToolRun;
using test_support::tsnap_cli;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class DistCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
#ifndef TSNAP_CLI_PATH
    GTEST_SKIP() << "built without the tsnap tool (TSNAP_BUILD_CLI)";
#endif
    dir_ = new TempDir();
    const test_support::Ranks ranks = test_support::run_ranks("sharded", 2, dir_->path(), 20000);
    for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks.texts[r], "ok") << "rank " << r;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (dir_ == nullptr || !fs::exists(snap())) GTEST_SKIP() << "no multi-rank snapshot";
  }
  static fs::path root() { return dir_->path() / "root"; }
  static fs::path snap() { return root() / "snap"; }
  static std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }
  static TempDir* dir_;
};

TempDir* DistCli::dir_ = nullptr;

TEST_F(DistCli, LsShowsTheWorldSize) {
  const ToolRun ls = tsnap_cli("ls " + quoted(root()));
  EXPECT_EQ(ls.status, 0) << ls.output;
  EXPECT_TRUE(has(ls.output, "RANKS")) << ls.output;
  EXPECT_TRUE(has(ls.output, "12      2  committed"))
      << ls.output;  // 12 keys (15 records), 2 ranks
  const ToolRun json = tsnap_cli("ls --json " + quoted(root()));
  EXPECT_EQ(nlohmann::json::parse(json.output).at(0).at("world_size"), 2);
}

TEST_F(DistCli, InspectShowsRanksAndHowEachKeyIsStored) {
  const ToolRun text = tsnap_cli("inspect " + quoted(snap()));
  EXPECT_EQ(text.status, 0) << text.output;
  EXPECT_TRUE(has(text.output, "world size:  2")) << text.output;
  EXPECT_TRUE(has(text.output, "keys:        12 (9 replicated, 3 sharded)")) << text.output;
  EXPECT_TRUE(has(text.output, "RANK  FILES")) << text.output;
  EXPECT_TRUE(has(text.output, "[37, 16]")) << text.output;  // sh.rows' global shape
  EXPECT_TRUE(has(text.output, "sharded, 2 pieces")) << text.output;
  EXPECT_TRUE(has(text.output, "PIECE OF")) << text.output;

  const ToolRun run = tsnap_cli("inspect --json " + quoted(snap()));
  ASSERT_EQ(run.status, 0) << run.output;
  const nlohmann::json j = nlohmann::json::parse(run.output);
  const Manifest m = read_manifest(snap());
  ASSERT_EQ(j.at("ranks").size(), 2u);
  uint64_t bytes = 0, tensor_bytes = 0;
  for (const auto& r : j.at("ranks")) {
    EXPECT_GT(r.at("bytes").get<uint64_t>(), 0u) << r.dump();
    bytes += r.at("bytes").get<uint64_t>();
    tensor_bytes += r.at("tensor_bytes").get<uint64_t>();
  }
  EXPECT_EQ(bytes, m.total_bytes());  // every byte once: replicated tensors are not repeated
  uint64_t stored = 0;
  for (const TensorRecord& t : m.tensors) stored += t.nbytes();
  EXPECT_EQ(tensor_bytes, stored);
  ASSERT_EQ(j.at("keys").size(), 12u);
  for (const auto& k : j.at("keys")) {
    const std::string name = k.at("name");
    if (name.rfind("sh.", 0) == 0) {
      EXPECT_EQ(k.at("kind"), "sharded") << name;
      EXPECT_EQ(k.at("pieces"), 2) << name;
      EXPECT_EQ(k.at("ranks"), nlohmann::json({0, 1})) << name;
    } else {
      EXPECT_EQ(k.at("kind"), "replicated") << name;
      EXPECT_EQ(k.at("pieces"), 1) << name;
      EXPECT_EQ(k.at("ranks").size(), 1u) << name;
    }
  }
  EXPECT_EQ(j.at("keys").at(10).at("name"), "sh.rows");
  EXPECT_EQ(j.at("keys").at(10).at("shape"), nlohmann::json({37, 16}));
}

TEST_F(DistCli, VerifyChecksEveryRanksFiles) {
  const ToolRun run = tsnap_cli("verify " + quoted(snap()));
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(has(run.output, "OK: 2 files")) << run.output;
}

TEST_F(DistCli, CatAssemblesAKeyStoredAsPieces) {
  const at::Tensor whole = load(snap()).at("sh.rows");
  char stats[160];
  std::snprintf(stats, sizeof stats, "min %.6g  max %.6g", whole.min().item<double>(),
                whole.max().item<double>());
  const ToolRun run = tsnap_cli("cat " + quoted(snap()) + " sh.rows");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(has(run.output, "shape:  [37, 16]")) << run.output;
  EXPECT_TRUE(has(run.output, "stored: 2 pieces (ranks 0,1)")) << run.output;
  EXPECT_TRUE(has(run.output, stats)) << stats << "\n" << run.output;

  // Rows across the pieces' boundary (rank 0 holds rows [0, 19)).
  const at::Tensor rows = whole.narrow(0, 17, 4);
  std::snprintf(stats, sizeof stats, "min %.6g  max %.6g", rows.min().item<double>(),
                rows.max().item<double>());
  const ToolRun part = tsnap_cli("cat " + quoted(snap()) + " sh.rows --rows 17:21");
  EXPECT_EQ(part.status, 0) << part.output;
  EXPECT_TRUE(has(part.output, stats)) << stats << "\n" << part.output;
  EXPECT_EQ(tsnap_cli("cat " + quoted(snap()) + " sh.rows --rows 30:40").status, 1);
  EXPECT_EQ(tsnap_cli("cat " + quoted(snap()) + " rep.0").status, 0);
}

TEST_F(DistCli, ConsolidateWritesOneProcessSnapshotThatDiffsIdentical) {
  const ToolRun run = tsnap_cli("consolidate " + quoted(snap()) + " one");
  ASSERT_EQ(run.status, 0) << run.output;
  const fs::path one = root() / "one";
  const Manifest m = read_manifest(one);
  EXPECT_EQ(m.world_size, 1);
  EXPECT_EQ(m.tensors.size(), 12u);
  for (const TensorRecord& t : m.tensors) EXPECT_FALSE(t.shard.has_value()) << t.name;
  EXPECT_EQ(m.metadata.value("step", 0), 7);
  const StateDict a = load(snap()), b = load(one);
  for (const auto& [key, entry] : a) {
    EXPECT_TRUE(bitwise_equal(entry.tensor, b.at(key))) << key;
    EXPECT_FALSE(b.entry(key).shard.has_value()) << key;
  }

  const ToolRun same = tsnap_cli("diff " + quoted(snap()) + " " + quoted(one));
  EXPECT_EQ(same.status, 0) << same.output;
  EXPECT_TRUE(has(same.output, "identical: 12 tensors")) << same.output;

  // A changed element in rank 1's piece of a sharded key.
  StateDict changed = load(one);
  changed.entry("sh.rows").tensor[30][3] += 1.0f;
  save(root() / "changed", changed);
  const ToolRun differ = tsnap_cli("diff " + quoted(snap()) + " " + quoted(root() / "changed"));
  EXPECT_EQ(differ.status, 1) << differ.output;
  EXPECT_TRUE(has(differ.output, "sh.rows")) << differ.output;
  EXPECT_TRUE(has(differ.output, "in 1 of 592 elements")) << differ.output;
  EXPECT_TRUE(has(differ.output, "1 of 12 common tensors differ")) << differ.output;

  // An existing target is refused unless --overwrite.
  const ToolRun again = tsnap_cli("consolidate " + quoted(snap()) + " " + quoted(one));
  EXPECT_EQ(again.status, 1) << again.output;
  EXPECT_TRUE(has(again.output, "--overwrite")) << again.output;
  EXPECT_EQ(read_manifest(one).id, m.id);
  EXPECT_EQ(tsnap_cli("consolidate --overwrite " + quoted(snap()) + " " + quoted(one)).status, 0);
  EXPECT_NE(read_manifest(one).id, m.id);
}

TEST_F(DistCli, ConsolidateKeepsStoredAndSourceDtypes) {
  StateDict sd;
  sd.insert("w", test_support::make_tensor(at::kFloat, {64, 3}, 1));
  sd.insert("steps", test_support::make_tensor(at::kLong, {4}, 2));
  save(root() / "half", sd, {{"note", "bf16"}}, {.dtype = at::kBFloat16});
  const ToolRun run = tsnap_cli("consolidate " + quoted(root() / "half") + " " +
                                quoted(dir_->path() / "elsewhere" / "half-one"));
  ASSERT_EQ(run.status, 0) << run.output;
  const Manifest m = read_manifest(dir_->path() / "elsewhere" / "half-one");
  EXPECT_EQ(m.find("w")->dtype, at::kBFloat16);
  EXPECT_EQ(m.find("w")->source_dtype, at::kFloat);
  EXPECT_EQ(m.find("steps")->dtype, at::kLong);
  EXPECT_EQ(m.metadata.value("note", ""), "bf16");
  EXPECT_TRUE(bitwise_equal(load(root() / "half").at("w"),
                            load(dir_->path() / "elsewhere" / "half-one").at("w")));
}

}  // namespace
}  // namespace tsnap
