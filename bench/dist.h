#pragma once
// The distributed save benchmark (tsnap_bench_dist): N rank processes on 127.0.0.1 hold the same
// replicated state (data parallel) and save it together, R times, through Snapshotters that
// share a DistGroup (a TCPStore that rank 0 hosts); a point is one N, and the baseline point is
// one process without a group. Each rank is this program run again (fork + exec of
// /proc/self/exe with the same arguments, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
// TSNAP_BENCH_DIST_POINT set), so that a rank holds only its own state and no thread state
// crosses a fork; the ranks line up before every save on the store and report their figures
// in a JSON file each. After each point the parent measures the raw device (write + fsync of
// one copy of the state), the baseline of the throughput ratios.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench/measure.h"
#include "bench/options.h"
#include "tsnap/save_handle.h"

namespace tsnap::bench {

class Progress;
class RawIo;

/// One rank's figures of one save. The times are on the steady clock (CLOCK_MONOTONIC, which
/// every process of the machine shares), in seconds.
struct RankSave {
  double call = 0;       ///< save_async called
  double returned = 0;   ///< save_async returned (with --lazy: staged)
  double committed = 0;  ///< wait() returned
  SaveStats stats;
};

/// What one point measured.
struct DistPoint {
  int world = 1;
  bool group = true;          ///< false: the baseline (one process, no DistGroup)
  std::string engine;         ///< e.g. "io_uring+O_DIRECT"
  uint64_t budget_bytes = 0;  ///< each rank's staging budget
  uint64_t state_bytes = 0;   ///< one copy of the state, as stored
  size_t tensors = 0;
  std::vector<std::vector<RankSave>> saves;  ///< by rank, then by save
  /// Bytes of each rank's files and of the snapshot, from the first save's manifest.
  std::vector<uint64_t> rank_file_bytes;
  uint64_t snapshot_bytes = 0;
  Series wall;       ///< per save: the first rank's save_async to the last rank's commit
  Series raw_write;  ///< raw write + fsync of state_bytes, `reps` times after the point
  /// Rank `rank`'s series of `field` of its SaveStats (stall_s, commit_s, ...).
  Series series(size_t rank, double SaveStats::*field) const;
  /// Whether every save's ranks stored exactly one copy of the state's tensor bytes.
  bool one_copy() const;
  /// "1, no group", "2", ...
  std::string label() const;
};

/// Whether this process is a rank that DistRunner started (its environment says so).
bool is_dist_rank();

/// A rank's side: joins the group (from the environment), builds the state of `o`, saves it
/// `o.reps` times in step with the other ranks (rank 0 removes each snapshot once every rank
/// is done with it) and writes its figures, or its error, for the parent. Returns the exit
/// status (0 also when the error went into the figures).
int run_dist_rank(const BenchOptions& o);

/// The parent's side. Thread-safety: none. Ownership: keeps `argv` (the program's, passed on to
/// the ranks), `progress` and the raw-io engine it builds on first use.
class DistRunner {
 public:
  DistRunner(const BenchOptions& o, char** argv, std::filesystem::path work, Progress& progress);
  ~DistRunner();
  /// Runs `world` ranks (0: the baseline) with their files under the work directory, kills
  /// them if they have not finished after `o.reps` saves within 10 minutes, then measures the
  /// raw writes. Errors: std::runtime_error naming a rank that failed, died or timed out.
  DistPoint run(int world);

 private:
  const BenchOptions& o_;
  char** argv_;
  std::filesystem::path work_;
  Progress& progress_;
  std::unique_ptr<RawIo> raw_;
};

}  // namespace tsnap::bench
