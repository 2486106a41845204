#include "bench/dist.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "bench/raw_io.h"
#include "bench/session.h"
#include "bench/workloads.h"
#include "common/remove_tree.h"
#include "tsnap/dist_group.h"
#include "tsnap/manifest.h"
#include "tsnap/remove.h"
#include "tsnap/snapshotter.h"

extern char** environ;

namespace fs = std::filesystem;

namespace tsnap::bench {
namespace {

constexpr const char* kPointEnv = "TSNAP_BENCH_DIST_POINT";              // the point's directory
constexpr std::chrono::milliseconds kTimeout = std::chrono::minutes(2);  // store waits
constexpr std::chrono::minutes kLimit{10};  // a point's ranks, all saves

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

fs::path figures_file(const fs::path& dir, int rank) {
  return dir / ("rank-" + std::to_string(rank) + ".json");
}

// The SaveStats fields the report uses.
nlohmann::json stats_json(const SaveStats& s) {
  return {
      {"stall_s", s.stall_s},   {"stage_s", s.stage_s},           {"write_s", s.write_s},
      {"commit_s", s.commit_s}, {"total_s", s.total_s},           {"coordinate_s", s.coordinate_s},
      {"bytes", s.bytes},       {"tensor_bytes", s.tensor_bytes}, {"files", s.files}};
}

SaveStats stats_of(const nlohmann::json& j) {
  SaveStats s;
  s.stall_s = j.at("stall_s");
  s.stage_s = j.at("stage_s");
  s.write_s = j.at("write_s");
  s.commit_s = j.at("commit_s");
  s.total_s = j.at("total_s");
  s.coordinate_s = j.at("coordinate_s");
  s.bytes = j.at("bytes");
  s.tensor_bytes = j.at("tensor_bytes");
  s.files = j.at("files");
  return s;
}

// Barriers of the ranks over the group's store (nothing without a group), and the handshake
// that keeps rank 0, which hosts the store, alive until the others are done with it.
class Barrier {
 public:
  explicit Barrier(std::shared_ptr<DistGroup> group) : group_(std::move(group)) {}
  void wait(const std::string& name) {
    if (!group_) return;
    group_->store()->set(key(name, group_->rank()), std::vector<uint8_t>{1});
    std::vector<std::string> keys;
    for (int r = 0; r < group_->world_size(); ++r) keys.push_back(key(name, r));
    group_->store()->wait(keys, kTimeout);
  }
  void finish() {
    if (!group_) return;
    if (group_->rank() != 0) {
      group_->store()->set(key("bye", group_->rank()), std::vector<uint8_t>{1});
      return;
    }
    std::vector<std::string> keys;
    for (int r = 1; r < group_->world_size(); ++r) keys.push_back(key("bye", r));
    if (!keys.empty()) group_->store()->wait(keys, kTimeout);
  }

 private:
  static std::string key(const std::string& name, int rank) {
    return "bench/" + name + "/" + std::to_string(rank);
  }
  std::shared_ptr<DistGroup> group_;
};

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket: no free port for the ranks' store");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error("bind 127.0.0.1: no free port for the ranks' store");
  return ntohs(addr.sin_port);
}

// Starts this program again with `argv` and `env` added to the environment (built before the
// fork: the child only execs).
pid_t spawn(char** argv, const std::vector<std::string>& env) {
  std::vector<std::string> strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string s = *e;
    const std::string name = s.substr(0, s.find('='));
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& x) {
      return x.compare(0, name.size() + 1, name + "=") == 0;
    });
    if (!replaced) strings.push_back(s);
  }
  strings.insert(strings.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (std::string& s : strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed: cannot start the ranks");
  if (pid == 0) {
    ::execve("/proc/self/exe", argv, envp.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace

Series DistPoint::series(size_t rank, double SaveStats::*field) const {
  Series s;
  for (const RankSave& x : saves.at(rank)) s.add(x.stats.*field);
  return s;
}

bool DistPoint::one_copy() const {
  if (saves.empty()) return false;
  for (size_t i = 0; i < saves[0].size(); ++i) {
    uint64_t sum = 0;
    for (const auto& rank : saves) sum += rank.at(i).stats.tensor_bytes;
    if (sum != state_bytes) return false;
  }
  return true;
}

std::string DistPoint::label() const { return std::to_string(world) + (group ? "" : ", no group"); }

bool is_dist_rank() { return std::getenv(kPointEnv) != nullptr; }

int run_dist_rank(const BenchOptions& o) {
  const fs::path dir = std::getenv(kPointEnv);
  const char* rank_env = std::getenv("RANK");
  const int rank = rank_env ? std::atoi(rank_env) : 0;
  nlohmann::json out = {{"rank", rank}};
  try {
    std::shared_ptr<DistGroup> group;
    if (rank_env) group = DistGroup::from_env({.timeout = kTimeout});
    const int world = group ? group->world_size() : 1;
    const StateDict state = gpt2_small_with_adam(o.size);
    const uint64_t bytes = output_bytes(state, std::nullopt);
    uint64_t largest = 0;
    for (const auto& [key, entry] : state)
      largest = std::max<uint64_t>(largest, entry.tensor.nbytes());
    // A budget of `auto` holds this rank's share: replicated tensors are assigned greedily by
    // size, so no rank gets more than an even share plus the largest tensor.
    SnapshotterOptions so = snapshotter_options(
        o, world == 1 ? bytes : std::min(bytes, bytes / world + largest), dir / "root");
    so.group = group;
    Barrier barrier(group);
    Snapshotter snap(so);
    out["engine"] = snap.engine_name();
    out["budget"] = so.staging.budget_bytes;
    out["state_bytes"] = bytes;
    out["tensors"] = state.size();
    nlohmann::json saves = nlohmann::json::array();
    for (int rep = 0; rep < o.reps; ++rep) {
      barrier.wait("ready-" + std::to_string(rep));
      SaveOptions save;
      save.staging = o.lazy ? Staging::kLazy : Staging::kEager;
      const double call = now_s();
      SaveHandle h =
          snap.save_async("snap-" + std::to_string(rep), state, nlohmann::json::object(), save);
      h.wait_staged();
      const double returned = now_s();
      h.wait();
      const double committed = now_s();
      saves.push_back({{"call", call},
                       {"returned", returned},
                       {"committed", committed},
                       {"stats", stats_json(h.stats())}});
      barrier.wait("saved-" + std::to_string(rep));
      if (rank == 0) {
        if (rep == 0) {
          const Manifest m = read_manifest(h.path());
          std::vector<uint64_t> per_rank(static_cast<size_t>(world), 0);
          for (const FileRecord& f : m.files) per_rank.at(static_cast<size_t>(f.rank)) += f.size;
          out["rank_file_bytes"] = per_rank;
          out["snapshot_bytes"] = m.total_bytes();
        }
        remove_snapshot(h.path());
      }
    }
    out["saves"] = std::move(saves);
    barrier.finish();
  } catch (const std::exception& e) {
    out["error"] = e.what();
  }
  std::ofstream(figures_file(dir, rank)) << out.dump();
  return 0;
}

DistRunner::DistRunner(const BenchOptions& o, char** argv, fs::path work, Progress& progress)
    : o_(o), argv_(argv), work_(std::move(work)), progress_(progress) {}

DistRunner::~DistRunner() = default;

DistPoint DistRunner::run(int world) {
  DistPoint p;
  p.group = world > 0;
  p.world = std::max(1, world);
  const fs::path dir = work_ / (p.group ? "ranks-" + std::to_string(world) : "plain");
  fs::create_directories(dir);
  progress_.show("[" + p.label() + "] " + std::to_string(p.world) +
                 " process(es): " + std::to_string(o_.reps) + " saves");

  std::vector<std::string> env = {std::string(kPointEnv) + "=" + dir.string()};
  if (p.group) {
    env.insert(env.end(), {"WORLD_SIZE=" + std::to_string(world), "MASTER_ADDR=127.0.0.1",
                           "MASTER_PORT=" + std::to_string(free_port())});
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < p.world; ++r) {
    std::vector<std::string> rank_env = env;
    if (p.group) rank_env.push_back("RANK=" + std::to_string(r));
    pids.push_back(spawn(argv_, rank_env));
  }
  std::vector<int> statuses(pids.size(), -1);
  const auto deadline = Clock::now() + kLimit;
  for (size_t left = pids.size(); left > 0;) {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (statuses[r] == -1 && ::waitpid(pids[r], &statuses[r], WNOHANG) == pids[r]) --left;
    }
    if (left > 0 && Clock::now() > deadline) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (statuses[r] == -1) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], &statuses[r], 0);
        }
      }
      throw std::runtime_error("the ranks of point " + p.label() + " did not finish in " +
                               std::to_string(kLimit.count()) + " minutes");
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  const std::string of = " of point " + p.label();
  for (int r = 0; r < p.world; ++r) {
    const int status = statuses[static_cast<size_t>(r)];
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw std::runtime_error("rank " + std::to_string(r) + of + " ended abnormally (" +
                               (WIFSIGNALED(status)
                                    ? "signal " + std::to_string(WTERMSIG(status))
                                    : "status " + std::to_string(WEXITSTATUS(status))) +
                               ")");
    }
    std::ifstream in(figures_file(dir, r));
    if (!in) throw std::runtime_error("rank " + std::to_string(r) + of + " left no figures");
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.contains("error")) {
      throw std::runtime_error("rank " + std::to_string(r) + of + ": " +
                               j["error"].get<std::string>());
    }
    if (r == 0) {
      p.engine = j.at("engine");
      p.budget_bytes = j.at("budget");
      p.state_bytes = j.at("state_bytes");
      p.tensors = j.at("tensors");
      p.rank_file_bytes = j.at("rank_file_bytes").get<std::vector<uint64_t>>();
      p.snapshot_bytes = j.at("snapshot_bytes");
    }
    std::vector<RankSave> saves;
    for (const nlohmann::json& s : j.at("saves")) {
      saves.push_back({s.at("call"), s.at("returned"), s.at("committed"), stats_of(s.at("stats"))});
    }
    p.saves.push_back(std::move(saves));
  }
  for (int i = 0; i < o_.reps; ++i) {
    double first = p.saves[0][i].call, last = p.saves[0][i].committed;
    for (const auto& rank : p.saves) {
      first = std::min(first, rank[i].call);
      last = std::max(last, rank[i].committed);
    }
    p.wall.add(last - first);
  }
  detail::remove_tree(dir.string());

  const bool direct = p.engine.find("O_DIRECT") != std::string::npos;
  if (!raw_) {
    const SnapshotterOptions so = snapshotter_options(o_, p.state_bytes, work_);
    raw_ = std::make_unique<RawIo>(RawIoOptions{
        .uring = p.engine.rfind("io_uring", 0) == 0,
        .depth = so.io.queue_depth,
        .chunk = so.chunk_bytes,
        .buffers = static_cast<size_t>(std::max<unsigned>(2, std::min(so.io.queue_depth, 32u)))});
  }
  for (int i = 0; i < o_.reps; ++i) {
    progress_.show("[" + p.label() + "] raw write " + std::to_string(i + 1) + "/" +
                   std::to_string(o_.reps));
    p.raw_write.add(raw_->write((work_ / "raw.bin").string(), p.state_bytes, direct));
  }
  return p;
}

}  // namespace tsnap::bench
