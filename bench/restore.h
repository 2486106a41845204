#pragma once
// The restore benchmark: repetitions, interleaved so that the disk's drift hits every contender
// alike, of
//   raw direct    sequential O_DIRECT reads of an equal-size file through an io engine of the
//                 kind load_into uses, into warm registered buffers (RawIo), for each read size
//                 and queue depth of a small sweep (4 and 16 MiB x 16 and 32 in flight): the
//                 baseline is the fastest of them, not one fixed configuration;
//   raw buffered  a plain read() loop over the same file (16 MiB at a time);
//   tsnap         load_into the existing state (in place, verified) and load (new tensors);
//   torch         torch::load of the same tensors, saved with torch::save;
// each cold (the files evicted from the page cache first with posix_fadvise(DONTNEED): no root
// needed, and other processes' cache stays) and warm (the files read through the page cache
// first); and hot: load_into and load of the same snapshot from the staging buffers of the
// Snapshotter that saved it (keep_hot), which read no file. The peak extra RSS of load_into is
// measured by resetting the high-water mark (clear_refs 5).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/measure.h"
#include "tsnap/state_dict.h"

namespace tsnap::bench {

class Progress;

/// What the restore benchmark does.
struct RestoreSpec {
  uint64_t read_budget = 256ull << 20;  ///< LoadOptions::read_budget_bytes
  uint64_t chunk = 16ull << 20;         ///< chunk size of the snapshot and of the raw reads
  int reps = 3;
  bool torch = true;  ///< also torch::load
  /// Also from memory: the snapshot is saved by a Snapshotter with keep_hot, and load_into and
  /// load read its hot snapshot (tsnap/hot_snapshot.h) while it lives.
  bool hot = true;
};

/// The figures of a restore benchmark.
struct RestoreResult {
  uint64_t bytes = 0;  ///< the snapshot's shard bytes (and the raw file's size)
  size_t shards = 0;
  std::string engine;  ///< load_into's engine on the first (cold) load
  /// One configuration of the raw O_DIRECT read sweep.
  struct RawRead {
    uint64_t block = 0;
    unsigned depth = 0;
    Series s;
  };
  std::vector<RawRead> raw_direct;  ///< the sweep
  Series raw_buffered, cold_into, cold_load, cold_torch;
  Series warm_raw, warm_into, warm_into_noverify, warm_load, warm_torch;
  Series hot_into, hot_load;             ///< from the staging buffers (RestoreSpec::hot)
  std::string cold_engine, warm_engine;  ///< load_into's engine in the last cold / warm run
  long peak_extra_kib = 0;               ///< the largest VmHWM - VmRSS over a load_into
  /// The raw O_DIRECT read of the sweep with the lowest median.
  const RawRead& best_raw() const;
};

/// Saves `state` (a snapshot, a torch::save file, a raw file of the same size) under `work`,
/// then measures; loads write into `state` in place. The files stay in `work` (the caller
/// removes it). Errors: whatever the save, the loads, the raw io and torch throw.
RestoreResult run_restore(const RestoreSpec& spec, StateDict& state,
                          const std::filesystem::path& work, Progress& progress);

}  // namespace tsnap::bench
