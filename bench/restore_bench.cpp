// Restore benchmark (issue: fast restore). In one run, repetitions interleaved so that the
// disk's drift hits every contender alike, for the GPT-2-small + Adam state (~1.5 GB fp32):
//   raw direct    sequential O_DIRECT read of an equal-size file through the same engine, same
//                 chunk size and number of reads in flight, into warm aligned buffers;
//   raw buffered  a plain read() loop over the same file (16 MiB at a time);
//   tsnap         load_into the existing state (in place, verified) and load (new tensors);
//   torch         torch::load of the same tensors, saved with torch::save.
// Cold runs drop the page cache first (sync; echo 3 > /proc/sys/vm/drop_caches: needs root;
// the program says so when it cannot); warm runs read files that are in the page cache.
// Peak extra RSS of load_into is measured by resetting the high-water mark (clear_refs 5).
// Prints medians and min..max, and the ratios the restore issue targets.

#include <fcntl.h>
#include <sys/uio.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/engine.h"
#include "tsnap/load.h"
#include "tsnap/save.h"
#include "measure.h"
#include "workloads.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

using tsnap::bench::Series;
using tsnap::bench::since;

long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  }
  return 0;
}

// Resets the peak-RSS mark (VmHWM) to the current RSS; false where the kernel refuses.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

bool drop_caches() {
  ::sync();
  std::ofstream out("/proc/sys/vm/drop_caches");
  out << "3";
  out.flush();
  return static_cast<bool>(out);
}

// Reads a file through the page cache and discards it (to make it warm).
double buffered_read(const std::string& path) {
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("open " + path);
  std::vector<char> buf(16 << 20);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
  return since(t0);
}

// Sequential O_DIRECT read of `path` through `engine`: `chunk` bytes per read, as many reads
// in flight as there are buffers.
double direct_read(tsnap::io::Engine& engine, const std::string& path, uint64_t chunk,
                   std::vector<uint8_t*>& bufs) {
  const auto t0 = Clock::now();
  const int fd = engine.open(path, O_RDONLY | O_DIRECT, 0);
  if (fd < 0) throw std::runtime_error("raw: open " + path + " with O_DIRECT failed");
  const uint64_t size = fs::file_size(path);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> free_bufs;
  for (size_t i = 0; i < bufs.size(); ++i) free_bufs.push_back(static_cast<int>(i));
  size_t in_flight = 0;
  int failed = 0;
  for (uint64_t off = 0; off < size; off += chunk) {
    int b;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !free_bufs.empty(); });
      b = free_bufs.back();
      free_bufs.pop_back();
      ++in_flight;
    }
    engine.read(fd, bufs[b], chunk, off, b, [&, b](int rc) {
      std::lock_guard<std::mutex> lock(mu);
      if (rc < 0) failed = rc;
      free_bufs.push_back(b);
      --in_flight;
      cv.notify_one();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return in_flight == 0; });
  engine.close(fd);
  if (failed) throw std::runtime_error("raw direct read failed: " + std::to_string(failed));
  return since(t0);
}

double torch_load(const std::string& path) {
  const auto t0 = Clock::now();
  std::vector<at::Tensor> tensors;
  torch::load(tensors, path);
  return since(t0);
}

struct Args {
  std::string dir = "/work/bench-restore";
  int reps = 3;
  double scale = 1.0;
  uint64_t budget = 256ull << 20;
  uint64_t chunk = 16ull << 20;
  bool torch = true;
  bool keep = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--dir") {
      a.dir = val();
    } else if (k == "--reps") {
      a.reps = std::stoi(val());
    } else if (k == "--scale") {
      a.scale = std::stod(val());
    } else if (k == "--budget-mb") {
      a.budget = std::stoull(val()) << 20;
    } else if (k == "--chunk-mb") {
      a.chunk = std::stoull(val()) << 20;
    } else if (k == "--no-torch") {
      a.torch = false;
    } else if (k == "--keep") {
      a.keep = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--dir D] [--reps N] [--scale S] [--budget-mb M] [--chunk-mb M]\n"
                   "          [--no-torch] [--keep]\n",
                   argv[0]);
      std::exit(k == "--help" ? 0 : 2);
    }
  }
  return a;
}

void row(const char* name, const Series& s, double bytes) {
  std::printf("  %-32s %8.3f s  (%.3f..%.3f)  %6.2f GB/s\n", name, s.median(), s.min(), s.max(),
              bytes / s.median() / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  fs::create_directories(args.dir);
  const std::string snap = args.dir + "/snap", torch_file = args.dir + "/state.pt",
                    raw_file = args.dir + "/raw.bin";
  std::printf("building GPT-2-small-like state with Adam moments (scale %.2f)...\n", args.scale);
  tsnap::StateDict state = tsnap::bench::gpt2_small_with_adam(args.scale);
  std::printf("state: %zu tensors, %.3f GB fp32\n", state.size(), state.nbytes() / 1e9);

  fs::remove_all(snap);
  tsnap::save(snap, state, {}, {.chunk_bytes = args.chunk});
  const uint64_t bytes = tsnap::read_manifest(snap).total_bytes();
  std::vector<at::Tensor> tensors;
  for (const auto& [k, e] : state) tensors.push_back(e.tensor);
  if (args.torch) torch::save(tensors, torch_file);
  tensors.clear();
  {
    // The raw baseline's file: as many bytes as the snapshot's shards, not zeros.
    std::vector<char> block(args.chunk, 0x5a);
    std::ofstream out(raw_file, std::ios::binary);
    for (uint64_t left = bytes; left > 0;) {
      const uint64_t n = std::min<uint64_t>(left, block.size());
      out.write(block.data(), static_cast<std::streamsize>(n));
      left -= n;
    }
  }
  std::vector<std::string> shards;
  for (const tsnap::FileRecord& f : tsnap::read_manifest(snap).files) {
    shards.push_back(snap + "/" + f.name);
  }
  const bool cold_ok = drop_caches();
  if (!cold_ok) {
    std::printf(
        "WARNING: cannot write /proc/sys/vm/drop_caches (not root?): the 'cold' runs "
        "below read from the page cache and are NOT cold.\n");
  }
  const tsnap::LoadOptions opts{.read_budget_bytes = args.budget};
  const std::string engine_name = tsnap::load_into(snap, state, opts).engine;

  // The raw baseline reads through an engine of the same kind, on its own io thread.
  boost::asio::io_context io;
  auto guard = boost::asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });
  const size_t nbufs = std::max<uint64_t>(1, args.budget / args.chunk);
  std::string why;
  std::shared_ptr<tsnap::io::Engine> engine =
      engine_name.rfind("io_uring", 0) == 0
          ? tsnap::io::make_uring_engine(io, static_cast<unsigned>(nbufs), &why)
          : tsnap::io::make_pwrite_engine(4);
  std::vector<uint8_t*> bufs;
  std::vector<iovec> iovs;
  for (size_t i = 0; i < nbufs; ++i) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, args.chunk) != 0) return 1;
    std::memset(p, 1, args.chunk);
    bufs.push_back(static_cast<uint8_t*>(p));
    iovs.push_back({p, args.chunk});
  }
  engine->register_buffers(iovs);
  std::printf(
      "snapshot: %.3f GB in %zu shards; engine %s; read budget %.0f MiB, chunk %.0f "
      "MiB\n",
      bytes / 1e9, shards.size(), engine_name.c_str(), args.budget / 1048576.0,
      args.chunk / 1048576.0);

  Series raw_direct, raw_buffered, cold_into, cold_load, cold_torch, warm_into, warm_load,
      warm_torch, warm_raw, warm_into_noverify;
  tsnap::LoadOptions no_verify = opts;
  no_verify.verify = false;
  long peak_extra_kib = 0;
  std::string cold_engine, warm_engine;
  auto into = [&](Series& s, std::string* engine_used) {
    const long base = status_kib("VmRSS:");
    const bool reset = reset_peak_rss();
    const tsnap::LoadReport r = tsnap::load_into(snap, state, opts);
    s.add(r.seconds);
    *engine_used = r.engine;
    if (reset) peak_extra_kib = std::max(peak_extra_kib, status_kib("VmHWM:") - base);
  };
  auto load_new = [&](Series& s) {
    const auto t0 = Clock::now();
    tsnap::StateDict fresh = tsnap::load(snap, opts);
    s.add(since(t0));
  };
  for (int r = 0; r < args.reps; ++r) {
    std::printf("rep %d/%d: cold", r + 1, args.reps);
    std::fflush(stdout);
    drop_caches();
    raw_direct.add(direct_read(*engine, raw_file, args.chunk, bufs));
    drop_caches();
    raw_buffered.add(buffered_read(raw_file));
    drop_caches();
    into(cold_into, &cold_engine);
    drop_caches();
    load_new(cold_load);
    if (args.torch) {
      drop_caches();
      cold_torch.add(torch_load(torch_file));
    }
    std::printf(" warm");
    std::fflush(stdout);
    for (const std::string& s : shards) buffered_read(s);
    buffered_read(raw_file);
    warm_raw.add(buffered_read(raw_file));
    into(warm_into, &warm_engine);
    {
      const tsnap::LoadReport unverified = tsnap::load_into(snap, state, no_verify);
      warm_into_noverify.add(unverified.seconds);
    }
    load_new(warm_load);
    if (args.torch) {
      buffered_read(torch_file);
      warm_torch.add(torch_load(torch_file));
    }
    std::printf("\n");
  }

  std::printf("\nGPT-2-small + Adam restore, %d reps (median, min..max):\n", args.reps);
  std::printf(" cold%s:\n", cold_ok ? " (page cache dropped before each run)" : " (NOT COLD)");
  row("raw O_DIRECT read", raw_direct, bytes);
  row("raw buffered read", raw_buffered, bytes);
  row(("tsnap load_into [" + cold_engine + "]").c_str(), cold_into, bytes);
  row("tsnap load (new tensors)", cold_load, bytes);
  if (args.torch) row("torch::load", cold_torch, bytes);
  std::printf(" warm (files in the page cache):\n");
  row("raw buffered read", warm_raw, bytes);
  row(("tsnap load_into [" + warm_engine + "]").c_str(), warm_into, bytes);
  row("tsnap load_into, verify off", warm_into_noverify, bytes);
  row("tsnap load (new tensors)", warm_load, bytes);
  if (args.torch) row("torch::load", warm_torch, bytes);

  const double raw_best = std::min(raw_direct.median(), raw_buffered.median());
  std::printf("\nratios (targets in brackets):\n");
  std::printf("  cold load_into throughput / raw   %.2f  [>= 0.9]\n",
              raw_best / cold_into.median());
  if (args.torch) {
    std::printf("  cold torch::load / load_into      %.2f  [> 1]\n",
                cold_torch.median() / cold_into.median());
    std::printf("  warm torch::load / load_into      %.2f  [>= 2]\n",
                warm_torch.median() / warm_into.median());
    std::printf("  warm torch::load / load_into, no verify %.2f\n",
                warm_torch.median() / warm_into_noverify.median());
    std::printf("  cold torch::load / load           %.2f\n",
                cold_torch.median() / cold_load.median());
    std::printf("  warm torch::load / load           %.2f\n",
                warm_torch.median() / warm_load.median());
  }
  std::printf("  peak extra RSS of load_into       %.0f MiB  [<= %.0f MiB = budget + 64]\n",
              peak_extra_kib / 1024.0, args.budget / 1048576.0 + 64);

  engine.reset();
  guard.reset();
  io_thread.join();
  for (uint8_t* p : bufs) std::free(p);
  if (!args.keep) fs::remove_all(args.dir);
  return 0;
}
