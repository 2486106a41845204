#pragma once
// The parent's side of the distributed tests: spawns ranks of a scenario as processes of the
// test program itself (exec of /proc/self/exe running DistRank.Run, in dist_save_test.cpp), on
// 127.0.0.1 with a free port, and collects what each reported.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tsnap::test_support {

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Appends the threads' stacks of process `pid` to `file`, where gdb is installed: a rank that
// hangs says where before it is killed.
inline void dump_stacks(pid_t pid, const std::filesystem::path& file) {
  if (::access("/usr/bin/gdb", X_OK) != 0) return;
  const std::string cmd = "timeout 60 /usr/bin/gdb -p " + std::to_string(pid) +
                          " -batch -nx -ex 'thread apply all bt 30' >> '" + file.string() +
                          "' 2>&1";
  std::ofstream(file, std::ios::app) << "\n--- stacks of the ranks still running ---\n";
  (void)std::system(cmd.c_str());
}

struct Ranks {
  std::vector<int> statuses;       // waitpid statuses, by rank
  std::vector<std::string> texts;  // what each rank reported ("" if nothing)
  std::vector<std::string> errs;   // what each rank wrote to stderr
};

// Runs `world` ranks of `scenario` with the snapshot root `<dir>/root`; kills them all if they
// have not ended within `limit`. Each rank runs the test `entry` of this program.
inline Ranks run_ranks(const std::string& scenario, int world, const std::filesystem::path& dir,
                       int timeout_ms, std::chrono::seconds limit = std::chrono::seconds(60),
                       const std::string& entry = "DistRank.Run") {
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("TSNAP_DIST_SCENARIO", scenario.c_str(), 1);
      ::setenv("TSNAP_DIST_ROOT", (dir / "root").c_str(), 1);
      ::setenv("TSNAP_DIST_TIMEOUT_MS", std::to_string(timeout_ms).c_str(), 1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      const std::string err = (dir / ("rank-" + std::to_string(r) + ".err")).string();
      const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) ::dup2(fd, STDERR_FILENO);
      const std::string filter = "--gtest_filter=" + entry;
      execl("/proc/self/exe", "dist_test", filter.c_str(), "--gtest_brief=1", nullptr);
      _exit(127);
    }
    pids.push_back(pid);
  }
  Ranks out;
  out.statuses.assign(static_cast<size_t>(world), -1);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int left = world;
  std::vector<int> stuck;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (out.statuses[r] != -1) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        out.statuses[r] = status;
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (out.statuses[r] != -1) continue;
        stuck.push_back(r);
        dump_stacks(pids[r], dir / ("rank-" + std::to_string(r) + ".err"));
        ::kill(pids[r], SIGKILL);
      }
      for (int r : stuck) ::waitpid(pids[r], &out.statuses[r], 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir / ("rank-" + std::to_string(r) + ".txt"));
    std::stringstream text;
    text << in.rdbuf();
    out.texts.push_back(text.str());
    std::ifstream err(dir / ("rank-" + std::to_string(r) + ".err"));
    std::stringstream err_text;
    err_text << err.rdbuf();
    out.errs.push_back(err_text.str());
  }
  if (!stuck.empty()) {
    std::string which;
    for (int r : stuck) which += "\n--- rank " + std::to_string(r) + " ---\n" + out.errs[r];
    ADD_FAILURE() << scenario << ": ranks still running after " << limit.count() << " s" << which;
  }
  return out;
}

}  // namespace tsnap::test_support
