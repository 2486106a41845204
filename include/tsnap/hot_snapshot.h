#pragma once
/// \file
/// `tsnap::HotSnapshot`: the last snapshot a Snapshotter committed, still in its staging buffers
/// (`SnapshotterOptions::staging.keep_hot`), which `tsnap::load` and `tsnap::load_into`
/// (tsnap/load.h) and `tsnap::load_checkpoint` (tsnap/checkpoint.h) read without touching the disk:
/// roll training back a few steps after a NaN loss or a caught exception while the process is
/// alive.
/// ```
/// tsnap::SnapshotterOptions options;
/// options.root = "ckpt";
/// options.staging.keep_hot = true;
/// tsnap::Snapshotter snap(options);
/// ...
/// if (!std::isfinite(loss.item<double>())) {
///   if (tsnap::HotSnapshot hot = snap.hot_snapshot()) {
///     tsnap::load_checkpoint(hot).apply({{"model", model}, {"optim", tsnap::bind(opt, model)}});
///   }
/// }
/// ```
/// A hot load reads the same bytes a load of the snapshot's directory would read and verifies
/// every chunk against the manifest's XXH3-64 before its bytes are used, so it gives the same
/// tensors, bit for bit, and the same errors (FormatError(kHashMismatch) for a corrupt buffer).
///
/// Lifetime: a HotSnapshot is a handle, not a pin. The bytes stay in the Snapshotter's staging
/// pool until a later save commits (its image replaces this one) or needs the buffers (eviction);
/// a load holds them for the length of the call only, so a save never waits on a handle someone
/// forgot, and never on anything but a load that is running. A load after eviction throws
/// IoError(kNotFound); `resident()` tells beforehand (a hint: a save may evict it just after).

#include <filesystem>
#include <memory>
#include <string>

#include "tsnap/export.h"
#include "tsnap/manifest.h"

namespace tsnap {

namespace detail {
struct HotAccess;
}  // namespace detail

/// A committed snapshot whose bytes are (or were) in a Snapshotter's staging buffers. Obtained
/// from `Snapshotter::hot_snapshot()`; a default-constructed (or "none") handle is empty.
/// Thread-safety: a value type; const use from several threads is fine, and loads from several
/// threads may run at once. Ownership: shares the snapshot's manifest (valid for the handle's
/// lifetime); the bytes belong to the Snapshotter (see the file comment).
class TSNAP_API HotSnapshot {
 public:
  /// An empty handle ("no hot snapshot").
  HotSnapshot() = default;
  /// Whether the handle refers to a snapshot (it may be evicted since: see resident()).
  explicit operator bool() const noexcept { return impl_ != nullptr; }
  /// The snapshot's name and directory (`<root>/<name>`), as committed. Errors:
  /// InvalidArgument on an empty handle (also for manifest()).
  const std::string& name() const;
  const std::filesystem::path& path() const;
  /// The manifest as committed (the same as `read_manifest(path())` while the directory is
  /// unchanged): keys, dtypes, shapes, the user's metadata, chunk hashes. With a group
  /// (distributed saves) it is this rank's view: its own files, and files named
  /// `memory-r<rank>-<i>.safetensors` (never on disk) holding the replicated entries other
  /// ranks wrote, with the hashes of this rank's bytes; other ranks' pieces are not in it. So
  /// `load` gives this rank's state as it saved it (its pieces with their ShardSpecs, every
  /// replicated entry), and `load_into` fills destinations of this rank's pieces (the same
  /// sharding; another needs the directory). Replicated entries are equal on every rank by
  /// contract, so the hot restore gives what a restore from the directory gives.
  const Manifest& manifest() const;
  /// Whether the bytes are still in memory now (false for an empty handle).
  bool resident() const;

  struct Impl;

 private:
  friend struct detail::HotAccess;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tsnap
