#pragma once
/// \file
/// `tsnap::Progress`: how far a long save or load has come, for a progress bar or a log.
/// ```
/// tsnap::SaveOptions options;
/// options.progress = [](const tsnap::Progress& p) {
///   std::fprintf(stderr, "\r%.0f%% written", 100.0 * p.done_bytes / p.total_bytes);
/// };
/// snap.save_async("step-100", state, {}, options);
/// ```

#include <cstdint>
#include <functional>

namespace tsnap {

/// Bytes of one save or load so far. Value type.
struct Progress {
  /// Bytes the operation moves in all: a save's shard files (this rank's, in a distributed
  /// save), a load's chunks to read.
  uint64_t total_bytes = 0;
  /// A save's bytes copied into staging buffers (the tensors may change once all are); equal to
  /// `done_bytes` for a load.
  uint64_t staged_bytes = 0;
  /// A save's bytes written (durable once the save commits); a load's bytes read and verified.
  uint64_t done_bytes = 0;
};

/// Receives a Progress after every chunk staged, written or read (chunks are 16-64 MiB, so
/// calls are infrequent). Calls never overlap but come from tsnap's threads: keep it short,
/// never block in it and never call tsnap from it. An exception it throws is swallowed.
using ProgressFn = std::function<void(const Progress&)>;

}  // namespace tsnap
