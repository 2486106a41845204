// The first save of a process, as a user's loop makes it: a new Snapshotter with default
// options (the automatic staging budget, no `prepare`), then save_async of a small state;
// its stall against the next save's. Each repetition runs in a fresh child process, so the
// first save pays for everything a process starts with (the staging pool, the TBB arena, the
// io thread). Target: <= 10 ms for a 10 MB state; for larger states, the first stall within
// 1.5x of the later ones'. `--saves N` makes N saves per process and prints each one's stall
// (median over the processes) and the later saves' durable GB/s.
//
//   tsnap_bench_first_save [--mb 1,10,100] [--reps 9] [--saves 2] [--dir DIR]

#include <ATen/ATen.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tsnap/snapshotter.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kMaxSaves = 16;

struct Saves {
  double stall_ms[kMaxSaves] = {};
  double durable_s[kMaxSaves] = {};
};

// In a child process: a state of `mb` MB (4 fp32 tensors), a new Snapshotter, `saves` saves
// (each removed once durable).
Saves measure(double mb, int saves, const fs::path& root) {
  tsnap::StateDict state;
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(mb * 1e6 / 16));
  for (int i = 0; i < 4; ++i) state.insert("layer" + std::to_string(i) + ".weight", at::randn({n}));
  tsnap::Snapshotter snap({.root = root});
  Saves s;
  for (int k = 0; k < saves; ++k) {
    const auto t0 = Clock::now();
    tsnap::SaveHandle h = snap.save_async("save" + std::to_string(k), state);
    s.stall_ms[k] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    h.wait();
    s.durable_s[k] = std::chrono::duration<double>(Clock::now() - t0).count();
    std::error_code ec;
    fs::remove_all(h.path(), ec);
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The first save's stall in a fresh process, small states"};
  std::vector<double> sizes = {1, 10, 100};
  int reps = 9;
  int saves = 2;
  fs::path dir = fs::temp_directory_path() / ("tsnap-bench-first-" + std::to_string(::getpid()));
  app.option_defaults()->always_capture_default();
  app.add_option("--mb", sizes, "State sizes in MB")->delimiter(',');
  app.add_option("--reps", reps, "Fresh processes per size")->check(CLI::Range(1, 1000));
  app.add_option("--saves", saves, "Saves per process (the first, then the later ones)")
      ->check(CLI::Range(2, kMaxSaves));
  app.add_option("--dir", dir, "Where the snapshots go (removed afterwards)");
  CLI11_PARSE(app, argc, argv);

  std::printf("%8s %14s %18s %14s %18s %12s  %s\n", "state MB", "first stall ms", "min..max",
              "next stall ms", "min..max", "next GB/s", "first / next");
  for (double mb : sizes) {
    std::vector<std::vector<double>> stall(saves);
    std::vector<double> next, next_gbs;
    for (int rep = 0; rep < reps; ++rep) {
      const fs::path root = dir / ("mb" + std::to_string(mb) + "-" + std::to_string(rep));
      int fds[2];
      if (::pipe(fds) != 0) return 1;
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(fds[0]);
        const Saves s = measure(mb, saves, root);
        const bool ok = ::write(fds[1], &s, sizeof s) == static_cast<ssize_t>(sizeof s);
        ::_exit(ok ? 0 : 1);
      }
      ::close(fds[1]);
      Saves s;
      const bool got = ::read(fds[0], &s, sizeof s) == static_cast<ssize_t>(sizeof s);
      ::close(fds[0]);
      int status = 0;
      ::waitpid(pid, &status, 0);
      if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "the child measuring %.0f MB failed\n", mb);
        return 1;
      }
      for (int k = 0; k < saves; ++k) {
        stall[k].push_back(s.stall_ms[k]);
        if (k > 0) next.push_back(s.stall_ms[k]);
        if (k > 0) next_gbs.push_back(mb * 1e6 / s.durable_s[k] / 1e9);
      }
    }
    const std::vector<double>& first = stall[0];
    std::printf("%8.0f %14.1f %8.1f..%-8.1f %14.1f %8.1f..%-8.1f %12.2f  %.2f\n", mb, median(first),
                *std::min_element(first.begin(), first.end()),
                *std::max_element(first.begin(), first.end()), median(next),
                *std::min_element(next.begin(), next.end()),
                *std::max_element(next.begin(), next.end()), median(next_gbs),
                median(first) / median(next));
    if (saves > 2) {
      std::printf("         stall ms of save 1..%d (median):", saves);
      for (int k = 0; k < saves; ++k) std::printf(" %.1f", median(stall[k]));
      std::printf("\n");
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
