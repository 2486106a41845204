// Google Benchmark micro-benchmarks of the hot kernels of a save: the staging copy with
// fp32 -> bf16 conversion (format::convert), chunk hashing (format::hash64, XXH3-64), and the
// staging of many small tensors (stage::fill_chunk over a plan from plan::make_plan).
//
//   build-bench/bench/tsnap_bench_micro --benchmark_min_time=0.2

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "bench/workloads.h"
#include "format/convert.h"
#include "format/hash.h"
#include "format/manifest_io.h"
#include "plan/plan.h"
#include "stage/fill.h"

namespace {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;

AlignedBuffer aligned_buffer(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes) != 0) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

// Copy + convert of `range(0)` fp32 elements to bf16 (or a plain fp32 copy for comparison).
void BM_ConvertF32ToBf16(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const at::Tensor src = at::randn({static_cast<int64_t>(n)});
  AlignedBuffer dst = aligned_buffer(n * 2);
  for (auto _ : state) {
    tsnap::format::convert(src.data_ptr(), at::kFloat, dst.get(), at::kBFloat16, n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 4));  // bytes read
}
BENCHMARK(BM_ConvertF32ToBf16)->Arg(1 << 16)->Arg(1 << 22)->Arg(1 << 24);

void BM_CopyF32(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const at::Tensor src = at::randn({static_cast<int64_t>(n)});
  AlignedBuffer dst = aligned_buffer(n * 4);
  for (auto _ : state) {
    tsnap::format::convert(src.data_ptr(), at::kFloat, dst.get(), at::kFloat, n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 4));
}
BENCHMARK(BM_CopyF32)->Arg(1 << 16)->Arg(1 << 22)->Arg(1 << 24);

// XXH3-64 of one chunk of `range(0)` bytes.
void BM_Hash64(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  AlignedBuffer buf = aligned_buffer(n);
  for (size_t i = 0; i < n; ++i) buf.get()[i] = static_cast<uint8_t>(i * 131);
  for (auto _ : state) benchmark::DoNotOptimize(tsnap::format::hash64(buf.get(), n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK(BM_Hash64)->Arg(64 << 10)->Arg(4 << 20)->Arg(16 << 20);

// Staging every chunk of a plan of `state`, 16 MiB chunks, into one buffer.
void fill_all(benchmark::State& state, const tsnap::StateDict& sd) {
  const uint64_t chunk = 16ull << 20;
  const tsnap::plan::Plan plan = tsnap::plan::make_plan(sd, {}, chunk, "micro", 1);
  std::vector<tsnap::stage::Sources> sources;
  for (const auto& file : plan.files) sources.push_back(tsnap::stage::prepare_sources(file));
  AlignedBuffer buf = aligned_buffer(chunk);
  for (auto _ : state) {
    for (size_t f = 0; f < plan.files.size(); ++f) {
      for (uint64_t c = 0; c < plan.files[f].num_chunks(); ++c) {
        benchmark::DoNotOptimize(tsnap::stage::fill_chunk(plan.files[f], sources[f], c, buf.get()));
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * plan.total_bytes));
  state.counters["tensors"] = static_cast<double>(plan.num_tensors);
}

// `range(0)` small tensors (4-64 KiB each).
void BM_FillSmallTensors(benchmark::State& state) {
  fill_all(state, tsnap::bench::small_tensors(static_cast<int>(state.range(0))));
}
BENCHMARK(BM_FillSmallTensors)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);

// The same bytes as `range(0)` small tensors in 8 large ones: what per-tensor work costs.
void BM_FillLargeTensors(benchmark::State& state) {
  const tsnap::StateDict small = tsnap::bench::small_tensors(static_cast<int>(state.range(0)));
  uint64_t bytes = 0;
  for (const auto& [key, entry] : small) bytes += entry.tensor.nbytes();
  fill_all(state, tsnap::bench::large_tensors(bytes, 8));
}
BENCHMARK(BM_FillLargeTensors)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);

// The caller's share of a save of `range(0)` small tensors before staging: the plan (layout,
// offsets, safetensors headers) and the staging sources.
void BM_PlanSmallTensors(benchmark::State& state) {
  const tsnap::StateDict sd = tsnap::bench::small_tensors(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    const tsnap::plan::Plan plan = tsnap::plan::make_plan(sd, {}, 16ull << 20, "micro", 1);
    for (const auto& file : plan.files) {
      benchmark::DoNotOptimize(tsnap::stage::prepare_sources(file));
    }
  }
  state.counters["tensors"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_PlanSmallTensors)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);

// The same, reusing the plan of an earlier save of the state (every periodic save but the
// first: plan::Layout::previous, the plan each save hands back to the next).
void BM_PlanSmallTensorsReused(benchmark::State& state) {
  const tsnap::StateDict sd = tsnap::bench::small_tensors(static_cast<int>(state.range(0)));
  const std::string id = "0000000000000001-00000001";
  tsnap::plan::Plan kept = tsnap::plan::make_plan(sd, {}, 16ull << 20, id, 1);
  for (auto _ : state) {
    tsnap::plan::Layout layout;
    layout.previous = {&kept};
    tsnap::plan::Plan plan = tsnap::plan::make_plan(sd, {}, 16ull << 20, id, 1, {}, layout);
    if (!plan.reused) state.SkipWithError("the plan was not reused");
    for (const auto& file : plan.files) {
      benchmark::DoNotOptimize(tsnap::stage::prepare_sources(file));
    }
    kept = std::move(plan);
  }
  state.counters["tensors"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_PlanSmallTensorsReused)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);

// The commit's CPU work on the manifest of `range(0)` small tensors: the text, and (second
// benchmark) the check that its own reader accepts it, and (third) the parse a hot image does.
tsnap::Manifest small_manifest(int count) {
  const tsnap::StateDict sd = tsnap::bench::small_tensors(count);
  const tsnap::plan::Plan plan = tsnap::plan::make_plan(sd, {}, 16ull << 20, "micro", 1);
  tsnap::Manifest m;
  m.id = "0000000000000001-00000001";
  m.created = "2026-01-01T00:00:00Z";
  m.created_unix_ns = 1767225600ll * 1000000000ll;
  for (const auto& file : plan.files) {
    m.files.push_back({file.name, file.size, file.data_offset, file.chunk_bytes,
                       std::vector<uint64_t>(file.num_chunks(), 0x0123456789abcdefull)});
    for (const auto& t : file.tensors) {
      m.tensors.push_back({t.name, file.name, t.dtype, t.source_dtype, t.shape, t.begin, t.end});
    }
  }
  return m;
}

void BM_ManifestText(benchmark::State& state) {
  const tsnap::Manifest m = small_manifest(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(tsnap::format::manifest_to_text(m));
}
BENCHMARK(BM_ManifestText)->Arg(10000)->Unit(benchmark::kMillisecond);

void BM_ManifestCheck(benchmark::State& state) {
  const std::string text =
      tsnap::format::manifest_to_text(small_manifest(static_cast<int>(state.range(0))));
  for (auto _ : state) tsnap::format::check_manifest_readable(text);
}
BENCHMARK(BM_ManifestCheck)->Arg(10000)->Unit(benchmark::kMillisecond);

void BM_ManifestParse(benchmark::State& state) {
  const std::string text =
      tsnap::format::manifest_to_text(small_manifest(static_cast<int>(state.range(0))));
  for (auto _ : state) benchmark::DoNotOptimize(tsnap::format::parse_manifest(text, "micro"));
}
BENCHMARK(BM_ManifestParse)->Arg(10000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
