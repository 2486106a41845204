#pragma once
/// \file
/// Options of one save (`tsnap::save`, `Snapshotter::save_async`).

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/export.h"
#include "tsnap/progress.h"

namespace tsnap {

/// When `save_async` returns.
enum class Staging {
  /// After every chunk is copied into staging buffers: the caller may then change its tensors.
  kEager,
  /// At once; staging runs in the background and the caller must call
  /// `SaveHandle::wait_staged()` before it next changes the tensors (e.g. before optimizer.step()).
  kLazy,
};

/// A per-key precision rule: keys that match `pattern` (a glob: `*`, `?`, `[...]`, as in
/// include/exclude) are stored as `dtype`; an unset `dtype` keeps their own dtype.
struct TSNAP_API DtypeRule {
  std::string pattern;
  std::optional<at::ScalarType> dtype;
};

/// The stale-state check of a save: tensors that training changes at every step must not hold
/// the same bytes as in the previous snapshot of the same Snapshotter once the step advanced
/// (both saves' `SaveOptions::step` known, this one's greater). A snapshot that fails it holds
/// state of an earlier step: an optimizer whose moments stopped updating (a cached handle to
/// old storage), a state dict copied once and saved ever since. Tensors are compared by the
/// hashes of their stored bytes, which every save computes anyway.
struct TSNAP_API StaleCheck {
  /// Keys (globs, as in include/exclude) of the tensors that must change: e.g. Adam's moments,
  /// `{"*/exp_avg", "*/exp_avg_sq"}`. Empty: no check.
  std::vector<std::string> must_change;
  /// true: a stale save fails with Error(kStale) naming the keys, and nothing is committed.
  /// false: it commits and lists the keys in SaveStats::stale (PeriodicSnapshots logs a warning).
  bool fail = false;
};

/// Globs of the optimizer moments that training changes at every step, in the keys tsnap
/// gives LibTorch's and PyTorch's optimizers (`optim/fc1.weight/exp_avg`,
/// `optim/state/0/exp_avg`): `*/exp_avg`, `*/exp_avg_sq`, `*/momentum_buffer`, `*/square_avg`.
/// PeriodicSnapshots checks them by default (PeriodicOptions::stale_check).
TSNAP_API std::vector<std::string> optimizer_moment_keys();

/// Options of one save. In C++17: `tsnap::SaveOptions o; o.dtype = at::kBFloat16;`. Designated
/// initialisers need C++20 (or GCC's and Clang's extension in C++17, which -pedantic warns
/// about): `{.dtype = at::kBFloat16}`.
///
/// The precision rule: conversion (`dtype`, `dtype_rules`) applies to what training means by
/// weights and moments: floating tensors of more than one element. Counters and scalars keep
/// their dtype whatever is asked: one-element tensors, 0-d or not (Adam's and AdamW's
/// per-parameter `step`, a loss scale, a `global_step` kept in a tensor of shape [1]),
/// any key whose last component is `step`, and integer and bool tensors. A bf16 `step` would
/// stop counting at 256 (1001 is stored as 1000), and an fp16 loss scale of 65539 would become
/// inf. Only an explicit per-entry `StateEntry::dtype` converts a scalar; a `dtype_rules` entry
/// that matches only such keys is an error (InvalidArgument naming it), never silently ignored.
struct TSNAP_API SaveOptions {
  /// Store floating tensors (f64/f32/f16/bf16) as this dtype, under the precision rule above.
  /// A matching `dtype_rules` entry or a per-entry `StateEntry::dtype` wins over this. Unset
  /// keeps every dtype.
  std::optional<at::ScalarType> dtype;
  /// Per-key refinements of `dtype`, the first matching rule wins:
  /// `o.dtype = at::kBFloat16; o.dtype_rules = {{"*/exp_avg_sq", at::kFloat}};` keeps Adam's
  /// second moments in fp32. Keys are matched as they are saved (`optim/fc1.weight/exp_avg_sq`
  /// in a Checkpoint). The precision rule holds for them too. Errors (at save_async):
  /// InvalidArgument for a malformed pattern or a non-floating dtype.
  std::vector<DtypeRule> dtype_rules;
  /// Replace an existing snapshot of the same name (atomically: a reader always sees either the
  /// old or the new one). Without it, saving onto an existing name throws kAlreadyExists.
  bool overwrite = false;
  /// See `Staging`.
  Staging staging = Staging::kEager;
  /// Number of shard files; 0 picks one per ~1 GiB, at most the Snapshotter's io.threads.
  /// Incremental saves pick their own files (see `incremental`) and ignore it.
  int num_shards = 0;
  /// Chunk size in bytes (multiple of 4096); 0 takes the Snapshotter's.
  uint64_t chunk_bytes = 0;
  /// Incremental save: chunks whose bytes equal the previous committed snapshot's are not
  /// written again, and a shard file whose bytes all equal becomes a hard link to that
  /// snapshot's file (a copy made by the kernel where links are refused), so frozen parameters
  /// and unchanged buffers cost no bytes. "Previous" is the last snapshot this Snapshotter
  /// committed, or at its first save the newest under its root (tsnap::latest). Files are
  /// grouped by key name (about 4 chunks each: 64 MiB by default; a larger tensor alone) and keep
  /// the grouping of the previous snapshot's files, so that unchanged tensors land in unchanged
  /// files. Each snapshot stays self-contained: deleting any other snapshot never breaks it. Its
  /// manifest is format version 2 once a file keeps an earlier layout (docs/format.md). Unset: the
  /// Snapshotter's default (SnapshotterOptions::incremental).
  std::optional<bool> incremental;
  /// Called as chunks are staged and written (see ProgressFn); a save does not complete before
  /// its last call has returned. Null: no calls.
  ProgressFn progress;
  /// The training step this snapshot holds, recorded in its manifest (`step`, shown by `tsnap
  /// inspect`) and used by `stale`. Unset: unknown. PeriodicSnapshots sets it.
  std::optional<int64_t> step;
  /// See StaleCheck. Errors (at save_async): InvalidArgument for a malformed pattern.
  StaleCheck stale;
};

}  // namespace tsnap
