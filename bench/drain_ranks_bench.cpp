// Node-local drains against one drainer: N rank processes on 127.0.0.1 save one snapshot of
// `--mib` MiB together (each its rows of 4 global fp32 tensors), then drain it to object storage,
//   every    each rank on a root of its own (TierOptions::node_local: N simulated nodes), every
//            rank uploading its share, the last one publishing;
//   alone    the ranks on one shared root, rank 0 draining every rank's files (the shared mode);
// same bytes, same store. The time to durable is from the first rank's local commit to the end
// of the last drain_wait (every: the publication; alone: rank 0's). `--rate-mib` paces each
// drain (TierOptions::bytes_per_second) as a per-connection limit of a real store would.
// Restore, after each "every" point: every rank at once loads its rows back from the store
// (load_into: ranged GETs of the chunks it needs, each verified), against raw ranged GETs of
// its own shard object (16 MiB ranges, the fetch's thread count) into memory; the figure is
// the median over ranks of raw / load_into.
// Usage:
//   eval "$(scripts/s3-server.sh start)"
//   build/bench/tsnap_bench_drain_ranks --bucket tsnap-bench --dir /tmp/bench/drain-ranks

#include <ATen/ATen.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <tuple>
#include <utility>
#include <vector>

#include "common/run_parallel.h"
#include "format/s3_root.h"
#include "io/s3_client.h"
#include "restore/s3_fetch.h"
#include "tsnap/dist_group.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/remove.h"
#include "tsnap/snapshotter.h"

namespace {

namespace fs = std::filesystem;

double now_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // shared by every process of the machine
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Rank `rank`'s restore of `snapshot` into zeroed pieces shaped as `state`'s, checked bitwise
// against it, and raw ranged GETs of its own shard object: both times, in seconds.
std::pair<double, double> restore_rank(const tsnap::StateDict& state, const std::string& snapshot,
                                       int rank, const std::function<void()>& between) {
  tsnap::StateDict into;
  for (const auto& [key, entry] : state) {
    into.insert(key, at::zeros_like(entry.tensor), {}, entry.shard);
  }
  const double t0 = now_s();
  tsnap::load_into(snapshot, into);
  const double load_s = now_s() - t0;
  for (const auto& [key, entry] : state) {
    if (!at::equal(into.at(key), entry.tensor)) {
      std::fprintf(stderr, "rank %d: %s came back different\n", rank, key.c_str());
      std::exit(1);
    }
  }
  between();  // the raw reads start together too
  const auto [root, name] = tsnap::format::S3Root::of_snapshot(snapshot);
  const tsnap::Manifest m = root.read_manifest(name);
  const std::string bucket = root.location().bucket;
  double raw_s = 0;
  for (const tsnap::FileRecord& f : m.files) {
    if (f.rank != rank) continue;
    const std::string key = root.key(name, f.name);
    std::vector<uint8_t> bytes(f.size);
    constexpr uint64_t kRange = 16ull << 20;
    const size_t ranges = static_cast<size_t>((f.size + kRange - 1) / kRange);
    const double t1 = now_s();
    tsnap::detail::run_parallel(ranges, tsnap::restore::kFetchThreads, [&](size_t r, int) {
      const uint64_t at = r * kRange;
      root.client().get_range(bucket, key, at, bytes.data() + at,
                              static_cast<size_t>(std::min(kRange, f.size - at)));
    });
    raw_s += now_s() - t1;
  }
  return {load_s, raw_s};
}

// One rank: save, drain, report "commit end" (monotonic seconds) to its file.
int run_rank(int mib, uint64_t rate) {
  const bool every = env("TSNAP_BENCH_MODE") == "every";
  auto group = tsnap::DistGroup::from_env();
  const int rank = group->rank(), world = group->world_size();
  tsnap::SnapshotterOptions o;
  o.root = fs::path(env("TSNAP_BENCH_ROOT")) / (every ? "node-" + std::to_string(rank) : "shared");
  o.group = group;
  o.tier.durable_root = env("TSNAP_BENCH_DURABLE");
  o.tier.node_local = every;
  o.tier.local_keep_last = 0;
  o.tier.bytes_per_second = rate;
  tsnap::Snapshotter snap(o);
  const int64_t cols = 1 << 16;
  const int64_t rows = static_cast<int64_t>(mib) * (1 << 20) / 4 / 4 / cols / world;
  tsnap::StateDict state;
  for (int i = 0; i < 4; ++i) {
    state.insert("t" + std::to_string(i), at::rand({rows, cols}), {},
                 tsnap::ShardSpec{{rows * world, cols}, {rows * rank, 0}});
  }
  snap.prepare(state);
  tsnap::SaveHandle h = snap.save_async("s", state);
  h.wait();
  const double commit = now_s();
  snap.drain_wait();
  const double end = now_s();
  const tsnap::DrainStats stats = snap.drain_stats();
  double load_s = 0, raw_s = 0;
  if (every) {
    // Once every rank has drained (the snapshot is published), every rank restores at once.
    auto barrier = [&](const std::string& key) {
      group->store()->add(key, 1);
      while (group->store()->add(key, 0) < world) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    };
    barrier("bench/drained");
    std::tie(load_s, raw_s) = restore_rank(state, o.tier.durable_root.string() + "/s", rank,
                                           [&] { barrier("bench/loaded"); });
  }
  std::ofstream report(env("TSNAP_BENCH_OUT"));
  report.precision(17);
  report << commit << " " << end << " " << stats.bytes << " " << stats.drained << " " << load_s
         << " " << raw_s;
  report.close();
  // Rank 0 hosts the store: it stays until every rank is done.
  group->store()->add("bench/done", 1);
  if (rank == 0) {
    while (group->store()->add("bench/done", 0) < world) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return 0;
}

// Runs `world` ranks of `mode`; returns the time to durable.
double run_point(char** argv, const std::string& mode, int world, const fs::path& dir,
                 const std::string& durable, std::vector<double>* restore_ratios,
                 std::vector<double>* restore_seconds) {
  const std::string port = std::to_string(free_port());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("TSNAP_BENCH_MODE", mode.c_str(), 1);
      ::setenv("TSNAP_BENCH_ROOT", dir.c_str(), 1);
      ::setenv("TSNAP_BENCH_DURABLE", durable.c_str(), 1);
      ::setenv("TSNAP_BENCH_OUT", (dir / ("rank-" + std::to_string(r))).c_str(), 1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      execv("/proc/self/exe", argv);  // the same options
      _exit(127);
    }
    pids.push_back(pid);
  }
  for (const pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "a rank of %s x%d failed (status %d)\n", mode.c_str(), world, status);
      std::exit(1);
    }
  }
  double first_commit = 1e300, last_end = 0;
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir / ("rank-" + std::to_string(r)));
    double commit = 0, end = 0, load_s = 0, raw_s = 0;
    uint64_t drained_bytes = 0;
    int drained = 0;
    in >> commit >> end >> drained_bytes >> drained >> load_s >> raw_s;
    if (load_s > 0) restore_ratios->push_back(raw_s / load_s);
    if (load_s > 0) restore_seconds->push_back(load_s);
    if (std::getenv("TSNAP_BENCH_VERBOSE")) {
      std::fprintf(stderr, "%s x%d rank %d: commit %.3f end %.3f, %llu bytes, %d published\n",
                   mode.c_str(), world, r, commit, end,
                   static_cast<unsigned long long>(drained_bytes), drained);
    }
    first_commit = std::min(first_commit, commit);
    last_end = std::max(last_end, end);
  }
  (void)tsnap::read_manifest(durable + "/s");  // published, or this throws
  tsnap::remove_snapshot(durable + "/s");
  fs::remove_all(dir);
  return last_end - first_commit;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Node-local drains by every rank against rank 0 draining alone"};
  std::string bucket = "tsnap-bench", dir = "/tmp/bench/drain-ranks", ranks = "2,4,8";
  int mib = 512, reps = 2, rate_mib = 0;
  app.add_option("--bucket", bucket, "Bucket (created if missing)");
  app.add_option("--dir", dir, "Where the ranks' local roots go");
  app.add_option("--mib", mib, "Snapshot size in MiB")->check(CLI::Range(16, 65536));
  app.add_option("--ranks", ranks, "Rank counts, comma-separated");
  app.add_option("--reps", reps, "Repetitions of each point")->check(CLI::Range(1, 100));
  app.add_option("--rate-mib", rate_mib, "Each drain's pace in MiB/s (0: unlimited)");
  CLI11_PARSE(app, argc, argv);
  const uint64_t rate = static_cast<uint64_t>(rate_mib) << 20;
  if (!env("TSNAP_BENCH_MODE").empty()) return run_rank(mib, rate);

  tsnap::format::s3_client()->create_bucket(bucket);
  std::printf("%d MiB per snapshot, drains paced at %s, %d reps, medians\n", mib,
              rate_mib ? (std::to_string(rate_mib) + " MiB/s each").c_str() : "no limit", reps);
  std::printf(
      "| ranks | rank 0 alone s | every rank s | alone GB/s | every GB/s | speed-up | "
      "restore s per rank | restore / raw ranged GETs |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<int> counts;
  for (size_t at = 0; at < ranks.size();) {
    const size_t comma = std::min(ranks.find(',', at), ranks.size());
    counts.push_back(std::stoi(ranks.substr(at, comma - at)));
    at = comma + 1;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (const int world : counts) {
    std::vector<double> alone, every, ratios, restores, unused;
    for (int rep = 0; rep < reps; ++rep) {
      // Interleaved, so that both modes see the server alike.
      const std::string durable = "s3://" + bucket + "/drain-ranks-" + std::to_string(world);
      alone.push_back(run_point(argv, "alone", world, fs::path(dir) / "alone", durable + "-alone",
                                &unused, &unused));
      every.push_back(run_point(argv, "every", world, fs::path(dir) / "every", durable + "-every",
                                &ratios, &restores));
    }
    const double gb = mib * 1048576.0 / 1e9;
    std::printf("| %d | %.3f | %.3f | %.3f | %.3f | %.2f | %.3f | %.2f |\n", world, median(alone),
                median(every), gb / median(alone), gb / median(every),
                median(alone) / median(every), median(restores), median(ratios));
    std::fflush(stdout);
  }
  return 0;
}
