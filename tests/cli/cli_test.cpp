// The `tsnap` tool on single-process snapshots, run as a process as a user runs it: export to
// Hugging Face, `ls` of a snapshot, `inspect` of a root, near-key hints, escaped key names.
// (The same tool on a multi-rank snapshot: tests/dist/cli_test.cpp.)

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "format/safetensors.h"
#include "support/test_util.h"
#include "support/tool_run.h"
#include "tsnap/load.h"
#include "tsnap/save.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;
using test_support::ToolRun;
using test_support::tsnap_cli;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef TSNAP_CLI_PATH
    GTEST_SKIP() << "built without the tsnap tool (TSNAP_BUILD_CLI)";
#endif
    StateDict state;
    state.insert("model/fc1.weight", test_support::make_tensor(at::kFloat, {8, 4}, 1));
    state.insert("model/fc1.bias", test_support::make_tensor(at::kFloat, {8}, 2));
    state.insert("optimizer/step", test_support::make_tensor(at::kLong, {}, 3));
    save(snap(), state);
  }
  fs::path root() const { return dir_.path() / "root"; }
  fs::path snap() const { return root() / "snap"; }
  TempDir dir_;
};

TEST_F(Cli, ExportHfOneObjectAsBf16) {
  const fs::path out = dir_.path() / "hf";
  const ToolRun run = tsnap_cli("export --hf " + quoted(out) + " " + quoted(snap()) +
                                " --object model --dtype bf16");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(has(run.output, "2 tensors")) << run.output;
  const fs::path file = out / "model.safetensors";
  if (test_support::have_python()) {
    const test_support::ReaderRun reader = test_support::run_reference_reader(file);
    EXPECT_EQ(reader.status, 0) << reader.output;
    EXPECT_TRUE(has(reader.output, "\"name\": \"fc1.weight\", \"dtype\": \"BF16\""))
        << reader.output;
  }
  const format::Header h = format::read_header(file);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.metadata.at("format"), "pt");

  // A checkpoint of several objects without --object is refused, naming them.
  const ToolRun objects =
      tsnap_cli("export --hf " + quoted(dir_.path() / "all") + " " + quoted(snap()));
  EXPECT_EQ(objects.status, 1) << objects.output;
  EXPECT_TRUE(has(objects.output, "2 objects (model, optimizer)")) << objects.output;
  EXPECT_TRUE(has(objects.output, "--object model")) << objects.output;
  EXPECT_FALSE(fs::exists(dir_.path() / "all"));

  // A model saved with bare keys. Split into files: the index names every key.
  const fs::path bare = root() / "bare";
  save(bare, StateDict{{"fc1.weight", test_support::make_tensor(at::kFloat, {8, 4}, 1)},
                       {"fc1.bias", test_support::make_tensor(at::kFloat, {8}, 2)},
                       {"step", test_support::make_tensor(at::kLong, {}, 3)}});
  const fs::path split = dir_.path() / "split";
  const ToolRun many =
      tsnap_cli("export --hf " + quoted(split) + " " + quoted(bare) + " --max-shard-size 64");
  ASSERT_EQ(many.status, 0) << many.output;
  std::ifstream in(split / "model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  EXPECT_EQ(index["weight_map"].size(), 3u);
  EXPECT_EQ(index["metadata"]["total_size"], 8 * 4 * 4 + 8 * 4 + 8);

  // An existing output is refused; a wrong dtype is a usage error.
  EXPECT_EQ(tsnap_cli("export --hf " + quoted(out) + " " + quoted(bare)).status, 1);
  const ToolRun linked =
      tsnap_cli("export --hf " + quoted(out) + " " + quoted(bare) + " --overwrite");
  EXPECT_EQ(linked.status, 0) << linked.output;
  EXPECT_TRUE(has(linked.output, "hard links")) << linked.output;
  const ToolRun copied =
      tsnap_cli("export --hf " + quoted(out) + " " + quoted(bare) + " --overwrite --copy");
  EXPECT_EQ(copied.status, 0) << copied.output;
  EXPECT_FALSE(has(copied.output, "hard links")) << copied.output;
  EXPECT_EQ(tsnap_cli("export --hf x " + quoted(snap()) + " --dtype i8").status, 2);
}

// `export --overwrite` never destroys what is not an export: a directory of the user's files or
// a file stays as it was, and the tool says why.
TEST_F(Cli, ExportOverwriteKeepsTheUsersFiles) {
  fs::create_directories(dir_.path() / "mine");
  std::ofstream(dir_.path() / "mine" / "notes.txt") << "my notes";
  std::ofstream(dir_.path() / "file.txt") << "a file";
  for (const char* out : {"mine", "file.txt"}) {
    const ToolRun run = tsnap_cli("export --hf " + quoted(dir_.path() / out) + " " +
                                  quoted(snap()) + " --object model --overwrite");
    EXPECT_EQ(run.status, 1) << run.output;
    EXPECT_TRUE(has(run.output, "overwrite replaces only")) << run.output;
  }
  EXPECT_TRUE(fs::exists(dir_.path() / "mine" / "notes.txt"));
  EXPECT_TRUE(fs::is_regular_file(dir_.path() / "file.txt"));
}

// Through a bind mount of the snapshot's parent (as containers mount volumes), the output
// names the snapshot by another path: the export compares directories (device and inode), not
// paths, and refuses. Runs the tool in a mount namespace of its own (unshare); skipped where
// mounts are not allowed.
TEST_F(Cli, ExportRefusesTheSnapshotReachedThroughABindMount) {
  const fs::path mnt = dir_.path() / "mnt";
  fs::create_directories(mnt);
  save(root() / "bare", StateDict{{"w", at::ones({3})}});
  const std::string cli = TSNAP_CLI_PATH;
  const std::string script =
      "mount --bind " + quoted(root()) + " " + quoted(mnt) + " || exit 77; for out in " +
      quoted(mnt / "bare") + " " + quoted(mnt / "bare" / "hf") + " " + quoted(mnt) + "; do " + cli +
      " export --hf \"$out\" " + quoted(root() / "bare") + " --overwrite && exit 1; done; exit 0";
  std::string escaped;
  for (char c : script) escaped += c == '\'' ? std::string("'\\''") : std::string(1, c);
  FILE* p =
      ::popen(("unshare --mount --propagation private sh -c '" + escaped + "' 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) output.append(buf, n);
  const int status = ::pclose(p);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77 || (code != 0 && has(output, "unshare"))) {
    GTEST_SKIP() << "bind mounts are not allowed here: " << output;
  }
  EXPECT_EQ(code, 0) << "an export through the bind mount replaced the snapshot: " << output;
  EXPECT_TRUE(has(output, "choose an output outside it")) << output;
  EXPECT_TRUE(verify(root() / "bare").empty());
  EXPECT_TRUE(test_support::bitwise_equal(load(root() / "bare").at("w"), at::ones({3})));
}

TEST_F(Cli, CatAndDiffAddressAnObjectOfACheckpoint) {
  const ToolRun cat = tsnap_cli("cat " + quoted(snap()) + " fc1.bias --object model");
  EXPECT_EQ(cat.status, 0) << cat.output;
  EXPECT_TRUE(has(cat.output, "model/fc1.bias")) << cat.output;
  const ToolRun none = tsnap_cli("cat " + quoted(snap()) + " fc1.bias --object modle");
  EXPECT_EQ(none.status, 1) << none.output;
  EXPECT_TRUE(has(none.output, "its objects: model, optimizer")) << none.output;

  // A checkpoint's model against a snapshot of the model alone (bare keys).
  save(root() / "bare", load(snap(), {.key_prefix = "model/"}));
  const ToolRun same =
      tsnap_cli("diff " + quoted(snap()) + " " + quoted(root() / "bare") + " --a-object model");
  EXPECT_EQ(same.status, 0) << same.output;
  EXPECT_TRUE(has(same.output, "identical: 2 tensors")) << same.output;
  const ToolRun both =
      tsnap_cli("diff " + quoted(snap()) + " " + quoted(snap()) + " --object optimizer");
  EXPECT_EQ(both.status, 0) << both.output;
  EXPECT_TRUE(has(both.output, "identical: 1 tensor")) << both.output;
  const ToolRun all = tsnap_cli("diff " + quoted(snap()) + " " + quoted(root() / "bare"));
  EXPECT_EQ(all.status, 1) << all.output;  // prefixed against bare: nothing in common
}

TEST_F(Cli, LsOfASnapshotSaysItIsOne) {
  const ToolRun run = tsnap_cli("ls " + quoted(snap()));
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(has(run.output, "is a snapshot")) << run.output;
  EXPECT_TRUE(has(run.output, "committed")) << run.output;
  EXPECT_FALSE(has(run.output, "no snapshots")) << run.output;
}

TEST_F(Cli, SizesIncludeTheManifest) {
  const ToolRun run = tsnap_cli("ls --json " + quoted(root()));
  ASSERT_EQ(run.status, 0) << run.output;
  const nlohmann::json list = nlohmann::json::parse(run.output);
  ASSERT_EQ(list.size(), 1u);
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(snap())) on_disk += e.file_size();
  EXPECT_EQ(list[0]["bytes"], on_disk);
  const ToolRun inspect = tsnap_cli("inspect " + quoted(snap()));
  EXPECT_TRUE(has(inspect.output, "+ MANIFEST.json (")) << inspect.output;
}

TEST_F(Cli, LsShowsWhatAnIncrementalSaveReused) {
  const fs::path inc = root() / "inc";
  {
    SnapshotterOptions o;
    o.root = inc;
    o.chunk_bytes = 64 << 10;
    o.incremental = true;
    Snapshotter snap(o);
    snap.save_async("a", test_support::fine_tuning_state(1)).wait();
    snap.save_async("b", test_support::fine_tuning_state(2)).wait();
  }
  const ToolRun run = tsnap_cli("ls --json " + quoted(inc));
  ASSERT_EQ(run.status, 0) << run.output;
  const nlohmann::json list = nlohmann::json::parse(run.output);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]["reused_bytes"], 0);
  EXPECT_GT(list[1]["reused_bytes"].get<uint64_t>(), list[1]["bytes"].get<uint64_t>() / 2);
  EXPECT_EQ(list[1]["written_bytes"].get<uint64_t>() + list[1]["reused_bytes"].get<uint64_t>(),
            list[1]["bytes"].get<uint64_t>());
  const ToolRun table = tsnap_cli("ls " + quoted(inc));
  EXPECT_TRUE(has(table.output, "REUSED")) << table.output;
  EXPECT_EQ(tsnap_cli("verify " + quoted(inc / "b")).status, 0);
}

TEST_F(Cli, InspectOfARootSuggestsLs) {
  const ToolRun run = tsnap_cli("inspect " + quoted(root()));
  EXPECT_EQ(run.status, 1) << run.output;
  EXPECT_TRUE(has(run.output, "tsnap ls " + root().string())) << run.output;
}

TEST_F(Cli, MissingKeySuggestsNearKeys) {
  const ToolRun run = tsnap_cli("cat " + quoted(snap()) + " fc1.weight");
  EXPECT_EQ(run.status, 1) << run.output;
  EXPECT_TRUE(has(run.output, "model/fc1.weight")) << run.output;
  const ToolRun typo = tsnap_cli("cat " + quoted(snap()) + " model/fc1.weigth");
  EXPECT_EQ(typo.status, 1) << typo.output;
  EXPECT_TRUE(has(typo.output, "model/fc1.weight")) << typo.output;
}

TEST_F(Cli, ControlCharactersInKeysAreEscaped) {
  const fs::path odd = root() / "odd";
  save(odd, StateDict{{"bad\nkey\x1b[31m", at::ones({2})}});
  const ToolRun run = tsnap_cli("inspect " + quoted(odd));
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(has(run.output, "bad\\x0akey\\x1b[31m")) << run.output;
  EXPECT_FALSE(has(run.output, "\x1b")) << run.output;
}

// `cat` decodes the stored bytes itself (the tool links no LibTorch) and prints them as PyTorch
// does: integers, floating values with 4 decimals, integral floats as "3.", a summary of the
// first and last 3 items beyond 1000 elements, bf16 decoded exactly.
TEST_F(Cli, CatPrintsStoredValuesAsPyTorchDoes) {
  StateDict state;
  state.insert("ints", at::arange(10, at::kLong));
  state.insert("halves", at::tensor({1.5f, -2.25f}).to(at::kBFloat16));
  state.insert("long", at::arange(2000, at::kFloat));
  state.insert("flag", at::tensor({1, 0}, at::kInt).to(at::kBool));
  state.insert("scalar", at::scalar_tensor(7, at::kLong));
  state.insert("hundreds", at::arange(100, 1101, at::kFloat));
  const fs::path values = root() / "values";
  save(values, state);
  const auto cat = [&](const std::string& key) {
    const ToolRun run = tsnap_cli("cat " + quoted(values) + " " + key);
    EXPECT_EQ(run.status, 0) << run.output;
    return run.output;
  };
  const std::string ints = cat("ints"), halves = cat("halves"), many = cat("long");
  const std::string flag = cat("flag"), scalar = cat("scalar"), hundreds = cat("hundreds");
  EXPECT_TRUE(has(ints, "tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])\n")) << ints;
  EXPECT_TRUE(has(halves, "tensor([ 1.5000, -2.2500])\n")) << halves;
  EXPECT_TRUE(has(halves, "dtype:  BF16\n")) << halves;
  // What torch.arange(2000.) and torch.arange(100, 1101.) print, wrapped lines included.
  EXPECT_TRUE(has(many,
                  "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n"
                  "        1.9990e+03])\n"))
      << many;
  EXPECT_TRUE(has(hundreds, "tensor([ 100.,  101.,  102.,  ..., 1098., 1099., 1100.])\n"))
      << hundreds;
  EXPECT_TRUE(has(many, "min 0  max 1999  mean 999.5")) << many;
  EXPECT_TRUE(has(flag, "tensor([ True, False])\n")) << flag;
  EXPECT_TRUE(has(scalar, "tensor(7)\n")) << scalar;
  const ToolRun rows = tsnap_cli("cat " + quoted(values) + " long --rows 1998:2000");
  EXPECT_TRUE(has(rows.output, "tensor([1998., 1999.])\n")) << rows.output;
}

// bench and consolidate make tensors: `tsnap` hands them to tsnap-torch, next to it, with the
// same command line (help, usage errors and exit codes included).
TEST_F(Cli, CommandsThatMakeTensorsRunInTsnapTorch) {
  const ToolRun help = tsnap_cli("bench --help");
  EXPECT_EQ(help.status, 0) << help.output;
  EXPECT_TRUE(has(help.output, "--preset")) << help.output;
  const ToolRun bad = tsnap_cli("consolidate --no-such-option");
  EXPECT_EQ(bad.status, 2) << bad.output;
  const ToolRun list = tsnap_cli("--help");
  EXPECT_TRUE(has(list.output, "bench")) << list.output;
  EXPECT_TRUE(has(list.output, "consolidate")) << list.output;
}

}  // namespace
}  // namespace tsnap
