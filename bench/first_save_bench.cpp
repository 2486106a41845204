// The first save of a process, as a user's loop makes it: a new Snapshotter with default
// options (the automatic staging budget, no `prepare`), then save_async of a small state;
// its stall against the next save's. Each repetition runs in a fresh child process, so the
// first save pays for everything a process starts with (the staging pool, the TBB arena, the
// io thread). Target: <= 10 ms for a 10 MB state.
//
//   tsnap_bench_first_save [--mb 1,10,100] [--reps 9] [--dir DIR]

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

struct Stalls {
  double first_ms = 0;
  double next_ms = 0;
};

// In a child process: a state of `mb` MB (4 fp32 tensors), a new Snapshotter, two saves.
Stalls measure(double mb, const fs::path& root) {
  tsnap::StateDict state;
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(mb * 1e6 / 16));
  for (int i = 0; i < 4; ++i) state.insert("layer" + std::to_string(i) + ".weight", at::randn({n}));
  tsnap::Snapshotter snap({.root = root});
  Stalls s;
  for (double* out : {&s.first_ms, &s.next_ms}) {
    const auto t0 = Clock::now();
    tsnap::SaveHandle h = snap.save_async(out == &s.first_ms ? "first" : "next", state);
    *out = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    h.wait();
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
  fs::path dir = fs::temp_directory_path() / ("tsnap-bench-first-" + std::to_string(::getpid()));
  app.option_defaults()->always_capture_default();
  app.add_option("--mb", sizes, "State sizes in MB")->delimiter(',');
  app.add_option("--reps", reps, "Fresh processes per size")->check(CLI::Range(1, 1000));
  app.add_option("--dir", dir, "Where the snapshots go (removed afterwards)");
  CLI11_PARSE(app, argc, argv);

  std::printf("%8s %14s %18s %14s  %s\n", "state MB", "first stall ms", "min..max", "next stall ms",
              "first / next");
  for (double mb : sizes) {
    std::vector<double> first, next;
    for (int rep = 0; rep < reps; ++rep) {
      const fs::path root = dir / ("mb" + std::to_string(mb) + "-" + std::to_string(rep));
      int fds[2];
      if (::pipe(fds) != 0) return 1;
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(fds[0]);
        const Stalls s = measure(mb, root);
        const bool ok = ::write(fds[1], &s, sizeof s) == static_cast<ssize_t>(sizeof s);
        ::_exit(ok ? 0 : 1);
      }
      ::close(fds[1]);
      Stalls s;
      const bool got = ::read(fds[0], &s, sizeof s) == static_cast<ssize_t>(sizeof s);
      ::close(fds[0]);
      int status = 0;
      ::waitpid(pid, &status, 0);
      if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "the child measuring %.0f MB failed\n", mb);
        return 1;
      }
      first.push_back(s.first_ms);
      next.push_back(s.next_ms);
    }
    std::printf("%8.0f %14.1f %8.1f..%-8.1f %14.1f  %.1f\n", mb, median(first),
                *std::min_element(first.begin(), first.end()),
                *std::max_element(first.begin(), first.end()), median(next),
                median(first) / median(next));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
