// Save-pipeline benchmark (issue: the asynchronous save pipeline). In one run, repetitions
// interleaved so that the disk's drift hits every contender alike:
//   raw     sequential O_DIRECT write of an equal-size file with the same engine, same chunk
//           size and queue depth, from warm aligned buffers, then fsync (the device's limit);
//   tsnap   save_async + wait: stall (time save_async blocks) and durable time (call ->
//           committed), for the state as fp32 and as bf16;
//   memcpy  a plain 2-thread memcpy of the same output bytes into warm buffers (the stall's
//           floor);
//   torch   torch::save + fsync of the same tensors.
// Also: 10,000 small tensors vs large tensors of the same total, and peak RSS over N saves.
// Prints medians and min..max, and the ratios the pipeline issue targets.

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "measure.h"
#include "tsnap/snapshotter.h"
#include "workloads.h"

namespace fs = std::filesystem;
using tsnap::bench::memcpy_2threads;
using tsnap::bench::output_bytes;
using tsnap::bench::peak_rss_kib;
using tsnap::bench::rss_kib;
using tsnap::bench::Series;
using tsnap::bench::torch_save_fsync;

namespace {

struct Args {
  std::string dir = "bench-tmp";
  int reps = 3;
  double scale = 1.0;
  uint64_t budget = 2048ull << 20;
  uint64_t chunk = 16ull << 20;
  int threads = 0;
  unsigned depth = 32;
  int soak = 0;
  bool small = true;
  bool torch = true;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--dir")
      a.dir = val();
    else if (k == "--reps")
      a.reps = std::stoi(val());
    else if (k == "--scale")
      a.scale = std::stod(val());
    else if (k == "--budget-mb")
      a.budget = std::stoull(val()) << 20;
    else if (k == "--chunk-mb")
      a.chunk = std::stoull(val()) << 20;
    else if (k == "--threads")
      a.threads = std::stoi(val());
    else if (k == "--depth")
      a.depth = static_cast<unsigned>(std::stoul(val()));
    else if (k == "--soak")
      a.soak = std::stoi(val());
    else if (k == "--no-small")
      a.small = false;
    else if (k == "--no-torch")
      a.torch = false;
    else {
      std::fprintf(stderr,
                   "usage: %s [--dir D] [--reps N] [--scale S] [--budget-mb M] [--chunk-mb M]\n"
                   "          [--threads N] [--depth N] [--soak N] [--no-small] [--no-torch]\n",
                   argv[0]);
      std::exit(k == "--help" ? 0 : 2);
    }
  }
  return a;
}

void row(const char* name, const Series& s, double bytes) {
  std::printf("  %-34s %8.3f s  (%.3f..%.3f)  %6.2f GB/s\n", name, s.median(), s.min(), s.max(),
              bytes / s.median() / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  fs::create_directories(args.dir);
  const long rss0 = rss_kib();
  std::printf("building GPT-2-small-like state with Adam moments (scale %.2f)...\n", args.scale);
  tsnap::StateDict state = tsnap::bench::gpt2_small_with_adam(args.scale);
  const uint64_t f32_bytes = output_bytes(state, std::nullopt);
  const uint64_t bf16_bytes = output_bytes(state, at::kBFloat16);
  std::printf("state: %zu tensors, %.3f GB fp32\n", state.size(), f32_bytes / 1e9);

  tsnap::Snapshotter snap({.root = args.dir,
                           .staging_budget_bytes = args.budget,
                           .chunk_bytes = args.chunk,
                           .stage_threads = args.threads,
                           .queue_depth = args.depth,
                           .max_in_flight = 1});
  const long rss_pool = rss_kib();
  std::printf("engine: %s, staging budget %.0f MiB, chunk %.0f MiB\n", snap.engine_name().c_str(),
              args.budget / 1048576.0, args.chunk / 1048576.0);

  // The raw baseline uses an engine of the same kind as the snapshotter's, with its own thread.
  const bool uring = snap.engine_name().rfind("io_uring", 0) == 0;
  const bool direct = snap.engine_name().find("O_DIRECT") != std::string::npos;
  const size_t nraw = std::max<size_t>(2, args.budget / args.chunk);
  tsnap::bench::RawIo raw_io(uring, args.depth, args.chunk, nraw);
  std::vector<uint8_t> warm(f32_bytes);
  std::memset(warm.data(), 1, warm.size());

  Series raw, f32_total, f32_stall, f32_stage, bf16_total, bf16_stall, copy_f32, copy_bf16, torch_t;
  double last_bytes_f32 = 0, last_bytes_bf16 = 0;
  for (int r = 0; r < args.reps; ++r) {
    std::printf("rep %d/%d: raw", r + 1, args.reps);
    std::fflush(stdout);
    raw.add(raw_io.write(args.dir + "/raw.bin", f32_bytes, direct));
    std::printf(" tsnap-f32");
    std::fflush(stdout);
    auto h = snap.save_async("f32-" + std::to_string(r), state);
    h.wait();
    f32_total.add(h.stats().total_s);
    f32_stall.add(h.stats().stall_s);
    f32_stage.add(h.stats().stage_s);
    last_bytes_f32 = h.stats().bytes;
    std::printf(" tsnap-bf16");
    std::fflush(stdout);
    auto hb = snap.save_async("bf16-" + std::to_string(r), state, {}, {.dtype = at::kBFloat16});
    hb.wait();
    bf16_total.add(hb.stats().total_s);
    bf16_stall.add(hb.stats().stall_s);
    last_bytes_bf16 = hb.stats().bytes;
    copy_f32.add(memcpy_2threads(state, std::nullopt, warm.data()));
    copy_bf16.add(memcpy_2threads(state, at::kBFloat16, warm.data()));
    if (args.torch) {
      std::printf(" torch.save");
      std::fflush(stdout);
      torch_t.add(torch_save_fsync(state, args.dir + "/torch.pt"));
    }
    std::printf("\n");
    fs::remove_all(args.dir + "/f32-" + std::to_string(r));
    fs::remove_all(args.dir + "/bf16-" + std::to_string(r));
  }

  std::printf("\nGPT-2-small + Adam, %d reps (median, min..max):\n", args.reps);
  row("raw O_DIRECT write + fsync", raw, f32_bytes);
  row("tsnap save fp32 (durable)", f32_total, last_bytes_f32);
  row("tsnap save bf16 (durable)", bf16_total, last_bytes_bf16);
  row("tsnap stall fp32", f32_stall, f32_bytes);
  row("tsnap stall bf16", bf16_stall, bf16_bytes);
  row("  of which staging copy fp32", f32_stage, f32_bytes);
  row("memcpy 2 threads fp32 bytes", copy_f32, f32_bytes);
  row("memcpy 2 threads bf16 bytes", copy_bf16, bf16_bytes);
  if (args.torch) row("torch::save + fsync", torch_t, f32_bytes);
  const double raw_bw = f32_bytes / raw.median();
  std::printf("\nratios (targets in brackets):\n");
  std::printf("  durable fp32 throughput / raw    %.2f  [>= 0.9]\n",
              (last_bytes_f32 / f32_total.median()) / raw_bw);
  std::printf("  durable bf16 throughput / raw    %.2f  [>= 0.9]\n",
              (last_bytes_bf16 / bf16_total.median()) / raw_bw);
  std::printf("  stall fp32 / memcpy              %.2f  [<= 1.2]\n",
              f32_stall.median() / copy_f32.median());
  std::printf("  stall bf16 / memcpy              %.2f  [<= 1.2]\n",
              bf16_stall.median() / copy_bf16.median());
  if (args.torch) {
    std::printf("  torch::save / stall fp32         %.1f  [>= 10]\n",
                torch_t.median() / f32_stall.median());
    std::printf("  torch::save / stall bf16         %.1f  [>= 10]\n",
                torch_t.median() / bf16_stall.median());
  }

  if (args.small) {
    state = tsnap::StateDict();
    tsnap::StateDict small = tsnap::bench::small_tensors(10000);
    const uint64_t small_bytes = output_bytes(small, std::nullopt);
    tsnap::StateDict large = tsnap::bench::large_tensors(small_bytes, 8);
    Series ts, tl, ts_stall, ts_commit;
    for (int r = 0; r < args.reps; ++r) {
      auto a = snap.save_async("small", small);
      a.wait();
      ts.add(a.stats().total_s);
      ts_stall.add(a.stats().stall_s);
      ts_commit.add(a.stats().commit_s);
      auto b = snap.save_async("large", large);
      b.wait();
      tl.add(b.stats().total_s);
      fs::remove_all(args.dir + "/small");
      fs::remove_all(args.dir + "/large");
    }
    std::printf("\n10,000 small tensors (4-64 KiB, %.0f MB) vs 8 large of the same total:\n",
                small_bytes / 1e6);
    row("small tensors (durable)", ts, small_bytes);
    row("large tensors (durable)", tl, small_bytes);
    row("  small: stall", ts_stall, small_bytes);
    row("  small: commit (fsync, manifest)", ts_commit, small_bytes);
    std::printf("  small / large throughput         %.2f  [>= 0.9]\n", tl.median() / ts.median());
  }

  if (args.soak > 0) {
    tsnap::StateDict s = tsnap::bench::gpt2_small_with_adam(args.scale);
    long first = 0, last = 0, lo = LONG_MAX, hi = 0;
    for (int i = 0; i < args.soak; ++i) {
      auto h = snap.save_async("soak", s, {}, {.overwrite = true});
      h.wait();
      const long r = rss_kib();
      if (i == 0) first = r;
      last = r;
      lo = std::min(lo, r);
      hi = std::max(hi, r);
    }
    fs::remove_all(args.dir + "/soak");
    std::printf("\nRSS over %d saves: first %.0f MiB, last %.0f MiB, range %.0f..%.0f MiB\n",
                args.soak, first / 1024.0, last / 1024.0, lo / 1024.0, hi / 1024.0);
  }
  std::printf(
      "\nmemory: RSS before %.0f MiB, after pool %.0f MiB, peak %.0f MiB; "
      "staging budget %.0f MiB\n",
      rss0 / 1024.0, rss_pool / 1024.0, peak_rss_kib() / 1024.0, args.budget / 1048576.0);
  return 0;
}
