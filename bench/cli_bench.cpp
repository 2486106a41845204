// The command-line tool's start-up: wall time and peak memory (max RSS) of each read-only
// command run as a user runs it (fork and exec, output discarded) on a small snapshot, `--reps`
// times each, against `tsnap-torch --version`, the same program with LibTorch linked (what
// every command cost before the tool was split). Targets: < 0.1 s and < 50 MB.
// This program makes the snapshot (with LibTorch), then becomes tsnap_bench_cli_runner, which
// links no LibTorch: a child's peak RSS counts what it inherits at fork, so the runs must start
// from a small process.
//
//   tsnap_bench_cli [--tool PATH] [--reps 20] [--dir DIR]

#include <ATen/ATen.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tsnap/save.h"

#ifndef TSNAP_CLI_PATH
#define TSNAP_CLI_PATH "tsnap"
#endif
#ifndef TSNAP_BENCH_CLI_RUNNER
#define TSNAP_BENCH_CLI_RUNNER "tsnap_bench_cli_runner"
#endif

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  CLI::App app{"Start-up time and memory of the tsnap tool's read-only commands"};
  std::string tool = TSNAP_CLI_PATH;
  int reps = 20;
  fs::path dir = fs::temp_directory_path() / ("tsnap-bench-cli-" + std::to_string(::getpid()));
  app.option_defaults()->always_capture_default();
  app.add_option("--tool", tool, "The tsnap program (tsnap-torch is found next to it)");
  app.add_option("--reps", reps, "Runs of each command")->check(CLI::Range(1, 1000));
  app.add_option("--dir", dir, "Where the small snapshot is made (removed afterwards)");
  CLI11_PARSE(app, argc, argv);

  // A small model-shaped snapshot: 8 MiB of fp32 weights and a step counter.
  fs::create_directories(dir);
  const fs::path snapshot = dir / "step-1";
  tsnap::StateDict state;
  state.insert("model.embed.weight", at::randn({512, 2048}));
  state.insert("model.head.weight", at::randn({512, 2048}));
  state.insert("model.head.bias", at::zeros({512}));
  state.insert("step", at::tensor(int64_t{1}));
  tsnap::save(snapshot, state);

  const std::string reps_text = std::to_string(reps);
  const std::string runner = TSNAP_BENCH_CLI_RUNNER;
  std::vector<const char*> args = {runner.c_str(), tool.c_str(),     reps_text.c_str(),
                                   dir.c_str(),    snapshot.c_str(), "model.head.bias",
                                   nullptr};
  ::execv(runner.c_str(), const_cast<char**>(args.data()));
  std::fprintf(stderr, "cannot run %s: %s\n", runner.c_str(), std::strerror(errno));
  fs::remove_all(dir);
  return 1;
}
