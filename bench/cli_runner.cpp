// The measuring half of tsnap_bench_cli (bench/cli_bench.cpp), which makes the snapshot and then
// becomes this program: it links no LibTorch, so the tool's runs, forked from it, start small
// and their peak RSS is theirs. Runs each command `reps` times (fork and exec, output
// discarded), prints the median and largest wall time and the largest peak RSS against the
// targets, then removes `dir`.
//
//   tsnap_bench_cli_runner TOOL REPS DIR SNAPSHOT KEY

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Run {
  double seconds = 0;
  double rss_mb = 0;
  int status = -1;
};

// Runs `args` (args[0] the program) with stdout and stderr to /dev/null.
Run run(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  Run r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rss_mb = usage.ru_maxrss / 1024.0;  // KiB on Linux
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: tsnap_bench_cli_runner TOOL REPS DIR SNAPSHOT KEY\n");
    return 2;
  }
  const std::string tool = argv[1], dir = argv[3], snapshot = argv[4], key = argv[5];
  const int reps = std::max(1, std::atoi(argv[2]));
  const std::string torch_tool = (fs::path(tool).parent_path() / "tsnap-torch").string();
  const std::vector<std::pair<std::string, std::vector<std::string>>> commands = {
      {"tsnap --version", {tool, "--version"}},
      {"tsnap ls ROOT", {tool, "ls", dir}},
      {"tsnap inspect SNAP", {tool, "inspect", snapshot}},
      {"tsnap verify SNAP", {tool, "verify", snapshot}},
      {"tsnap cat SNAP KEY", {tool, "cat", snapshot, key}},
      {"tsnap diff SNAP SNAP", {tool, "diff", snapshot, snapshot}},
      {"tsnap-torch --version", {torch_tool, "--version"}},
  };
  std::printf("%-24s %9s %9s %10s  %s\n", "command", "median s", "max s", "max RSS", "target");
  int failed = 0;
  for (const auto& [label, args] : commands) {
    std::vector<double> seconds;
    double rss = 0;
    for (int i = 0; i < reps; ++i) {
      const Run r = run(args);
      if (r.status != 0) {
        std::fprintf(stderr, "%s exited with status %d\n", label.c_str(), r.status);
        ++failed;
        break;
      }
      seconds.push_back(r.seconds);
      rss = std::max(rss, r.rss_mb);
    }
    if (seconds.empty()) continue;
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    const bool light = label.rfind("tsnap-torch", 0) != 0;
    std::printf("%-24s %9.4f %9.4f %7.1f MB  %s\n", label.c_str(), median, seconds.back(), rss,
                !light                       ? "(LibTorch loaded: for comparison)"
                : median < 0.1 && rss < 50.0 ? "< 0.1 s, < 50 MB: met"
                                             : "< 0.1 s, < 50 MB: MISSED");
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return failed == 0 ? 0 : 1;
}
