// The snapshot agent's benchmark (tsnap/agent.h), for one state:
//   stall       save_async's stall with the agent linked against without it (the hand-over:
//               one round trip and the manifest's text);
//   restore     a restarted trainer's time to the state in memory: from the agent's memory
//               (Snapshotter made, pool adopted and every chunk hashed, then load(hot)), from
//               the local disk cold (files evicted from the page cache first) and, with
//               --durable, from a durable directory drained to (cold too): seconds and GB/s.
// The agent runs in this process; the trainer's Snapshotter is destroyed before each restore
// (the agent keeps its pool, as when the trainer is killed). Medians of --reps, min..max.
//
//   tsnap_bench_agent --dir DIR [--durable DIR] [--mib 1024] [--reps 3]

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tsnap/agent.h"
#include "tsnap/hot_snapshot.h"
#include "tsnap/load.h"
#include "tsnap/snapshotter.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string figure(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  char s[96];
  std::snprintf(s, sizeof(s), "%.3f (%.3f..%.3f)", v[v.size() / 2], v.front(), v.back());
  return s;
}

void evict(const fs::path& dir) {
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("snapshot agent: save stall and restore from memory, disk and durable root");
  std::string dir, durable;
  int mib = 1024, reps = 3;
  app.add_option("--dir", dir, "Local directory (roots and the agent's socket)")->required();
  app.add_option("--durable", durable, "A durable root directory to restore from too");
  app.add_option("--mib", mib, "State size in MiB");
  app.add_option("--reps", reps, "Repetitions");
  CLI11_PARSE(app, argc, argv);

  tsnap::StateDict state;
  const int64_t per = int64_t(mib) * (1 << 20) / 4 / 16;
  for (int i = 0; i < 16; ++i) state.insert("layer" + std::to_string(i), at::randn({per}));
  const double gb = double(mib) * (1 << 20) / 1e9;
  fs::create_directories(dir);
  tsnap::Agent agent({.socket = fs::path(dir) / "agent.sock"});

  std::vector<double> stall_off, stall_on, memory, disk, from_durable;
  for (int r = 0; r < reps; ++r) {
    const fs::path plain = fs::path(dir) / "plain", linked = fs::path(dir) / "linked";
    fs::remove_all(plain);
    fs::remove_all(linked);
    // A warm save, then the measured one; `linked` hands them to the agent.
    auto save = [&](const fs::path& root, bool linked, std::vector<double>& stalls) {
      tsnap::SnapshotterOptions o;
      o.root = root;
      if (linked) o.agent.socket = agent.socket();
      if (linked && !durable.empty()) {
        o.tier.durable_root = fs::path(durable) / ("rep" + std::to_string(r));
      }
      tsnap::Snapshotter snap(o);
      snap.prepare(state);
      snap.save_async("warm", state).wait();
      auto t = Clock::now();
      tsnap::SaveHandle h = snap.save_async("s", state);
      stalls.push_back(since(t));
      h.wait();
      if (linked && !durable.empty()) snap.drain_wait();
    };
    save(plain, false, stall_off);
    save(linked, true, stall_on);
    agent.wait_unlinked();
    {
      auto t = Clock::now();
      tsnap::SnapshotterOptions o;
      o.root = linked;
      o.agent.socket = agent.socket();
      tsnap::Snapshotter snap(o);
      tsnap::StateDict back = tsnap::load(snap.hot_snapshot());
      memory.push_back(since(t));
    }
    agent.wait_unlinked();
    evict(linked / "s");
    auto t = Clock::now();
    tsnap::StateDict back = tsnap::load(linked / "s");
    disk.push_back(since(t));
    if (!durable.empty()) {
      const fs::path d = fs::path(durable) / ("rep" + std::to_string(r)) / "s";
      evict(d);
      t = Clock::now();
      back = tsnap::load(d);
      from_durable.push_back(since(t));
      fs::remove_all(fs::path(durable) / ("rep" + std::to_string(r)));
    }
  }
  auto rate = [&](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    char s[32];
    std::snprintf(s, sizeof(s), "%.2f GB/s", gb / v[v.size() / 2]);
    return std::string(s);
  };
  std::printf("state %.2f GB, %d reps (median, min..max seconds)\n", gb, reps);
  std::printf("save stall, no agent        %s\n", figure(stall_off).c_str());
  std::printf("save stall, agent linked    %s\n", figure(stall_on).c_str());
  std::printf("restore from agent memory   %s  %s\n", figure(memory).c_str(), rate(memory).c_str());
  std::printf("restore from local disk     %s  %s\n", figure(disk).c_str(), rate(disk).c_str());
  if (!from_durable.empty()) {
    std::printf("restore from durable root   %s  %s\n", figure(from_durable).c_str(),
                rate(from_durable).c_str());
  }
  return 0;
}
