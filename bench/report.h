#pragma once
// The outputs of the benchmarks: `tsnap bench`'s table, JSON, CSV and gnuplot PNG of its points
// and of its timeline, and the text reports of tsnap_bench_save, tsnap_bench_restore and
// tsnap_bench_dist. Every printer writes to stdout and only reads its results.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "bench/dist.h"
#include "bench/options.h"
#include "bench/restore.h"
#include "bench/runner.h"
#include "bench/timeline.h"

namespace tsnap::bench {

/// What the reports say about the benchmark's state.
struct StateInfo {
  std::string description;  ///< Workload::description
  uint64_t fp32_bytes = 0;  ///< its bytes as they are (fp32)
  size_t tensors = 0;
};

/// Prints `tsnap bench`'s points as a table with ratios, or as JSON (--json) or CSV (--csv).
void print_points(const BenchOptions& o, const StateInfo& state,
                  const std::vector<PointResult>& results);

/// Draws GB/s against the swept parameter into `o.plot` with gnuplot (the raw device bandwidth
/// is a line); its data and script go to `work`. Throws std::runtime_error if gnuplot fails.
void plot_points(const BenchOptions& o, const std::vector<PointResult>& results,
                 const std::filesystem::path& work);

/// Prints a timeline as a table, or as JSON (--json) or CSV (--csv).
void print_timeline(const BenchOptions& o, const StateInfo& state, const Timeline& tl);

/// Draws both runs' per-step times, snapshot steps marked, into `o.plot` with gnuplot; its data
/// and script go to `work`. Throws std::runtime_error if gnuplot fails.
void plot_timeline(const BenchOptions& o, const Timeline& tl, const std::filesystem::path& work);

/// What tsnap_bench_save measured.
struct SaveBenchResult {
  PointSpec spec;                     ///< its point: dtypes f32 then bf16, no reads
  PointResult point;                  ///< that point's figures
  std::optional<SmallVsLarge> small;  ///< small against large tensors, unless --no-small
  std::optional<Soak> soak;           ///< RSS over --soak saves, if asked for
  long rss_before_kib = 0;            ///< RSS before the state was built
};

/// tsnap_bench_save's report, with the targets' ratios.
void print_save_report(const SaveBenchResult& r);

/// tsnap_bench_dist's report: per point, the aggregate durable throughput against the raw
/// device, then per rank the bytes written, stall, commit and coordination, the dedup check and
/// the commit latency that coordination adds to the baseline's.
void print_dist_report(const BenchOptions& o, const std::vector<DistPoint>& points);

/// tsnap_bench_restore's report, with the targets' ratios.
void print_restore_report(const RestoreSpec& spec, const RestoreResult& r);

}  // namespace tsnap::bench
