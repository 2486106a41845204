#pragma once
/// \file
/// Reading snapshots back: `tsnap::load` (into new tensors), `tsnap::load_into` (into existing
/// tensors, in place, with dtype conversion), each from a snapshot directory or from a hot
/// snapshot (tsnap/hot_snapshot.h), and `tsnap::verify`.
///
/// Both loads share one read path: the chunks that hold the selected tensors are read whole and
/// in parallel (io_uring where available, O_DIRECT where the filesystem allows it and the file
/// is not already in the page cache) into a bounded set of aligned buffers, each chunk's XXH3-64
/// is checked, and its bytes are copied (or converted) straight into the destination tensors.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tsnap/engine_kind.h"
#include "tsnap/error.h"
#include "tsnap/export.h"
#include "tsnap/manifest.h"
#include "tsnap/progress.h"
#include "tsnap/state_dict.h"

namespace tsnap {

class HotSnapshot;

/// Options of a load. In C++17: `tsnap::LoadOptions o; o.include = {"model.*"};`. Designated
/// initialisers need C++20 (or GCC's and Clang's extension in C++17, which -pedantic warns
/// about): `{.include = {"model.*"}}`.
struct TSNAP_API LoadOptions {
  bool verify = true;                ///< Check every chunk's XXH3-64 (on by default).
  std::vector<std::string> include;  ///< Glob patterns of keys to load (empty = all).
  std::vector<std::string> exclude;  ///< Glob patterns of keys to skip; not with include.
  /// A pattern of `include`/`exclude` that matches no key is an error (kKeyNotFound, naming the
  /// nearest keys), so that a typo never loads nothing silently; set this to accept it.
  bool allow_unmatched = false;
  /// Read the snapshot's keys under this prefix, without it: with "model/", destination key
  /// "fc1.weight" reads the checkpoint's "model/fc1.weight" (load: only keys under the prefix,
  /// returned without it). Patterns apply to the keys without the prefix.
  std::string key_prefix;
  /// load_into only: make selected snapshot keys that the destination lacks an error
  /// (kKeyNotFound, listing them, before anything is written) instead of a LoadReport entry.
  bool require_every_key = false;
  /// load_into only: read and verify every selected chunk into read buffers first and write
  /// the destinations only once all of them are verified, so that a failed load changes
  /// nothing. The selected chunks must then fit in `read_budget_bytes`.
  bool atomic = false;
  /// Bytes of aligned read buffers: bounds the reads in flight and the extra memory of a load
  /// (a load_into uses no more than this beyond its destinations). Whole chunks are read, so
  /// at least one chunk is used whatever the budget; reads through the page cache use one
  /// buffer per core.
  uint64_t read_budget_bytes = 256ull << 20;
  /// Read engine: kAuto takes io_uring where the kernel allows it, else a pwrite/pread pool.
  EngineKind engine = EngineKind::kAuto;
  /// Read with O_DIRECT where the filesystem allows it and a shard is not mostly in the page
  /// cache already (cached files are read through the cache, which is faster).
  bool direct_io = true;
  int io_threads = 4;  ///< Threads of the pread engine.
  /// Called as chunks are read and verified (see ProgressFn). Null: no calls.
  ProgressFn progress;
};

/// Loads a snapshot into new CPU tensors in their stored dtype, bit-identical to what was
/// saved. Only the selected keys' chunks are read. A key that a distributed save stored as
/// several pieces comes back assembled into its whole (global) tensor, without a ShardSpec (to
/// read one rank's piece, give load_into a destination entry with that ShardSpec); a key stored
/// as a single piece comes back as stored, with its ShardSpec. Errors for pieces that do not
/// cover their tensor: Error(kUnsupported) naming the key.
/// Errors: IoError(kNotFound) for a missing snapshot or shard; FormatError (kUnsupportedFormat,
/// kTruncated, kHashMismatch naming file and chunk, ...); IoError naming file and offset;
/// InvalidArgument for bad patterns. Thread-safe (calls are independent).
/// Ownership: the returned tensors are new and owned by the caller.
TSNAP_API StateDict load(const std::filesystem::path& path, const LoadOptions& options = {});

/// What a load_into did.
struct TSNAP_API LoadReport {
  std::vector<std::string> loaded;  ///< Destination keys written, in key order.
  /// Snapshot keys (selected by include/exclude) that the destination does not have: not read.
  std::vector<std::string> not_in_destination;
  uint64_t bytes_read = 0;  ///< Bytes read from the shard files (whole chunks).
  std::string engine;       ///< "io_uring+O_DIRECT", "io_uring", "pwrite", ... as used.
  double seconds = 0;       ///< Wall time of the call.
};

/// Loads a snapshot into the existing tensors of `dest`, in place: the destination keys
/// selected by include/exclude get the snapshot's values, converted to each destination's
/// dtype where both are floating (bf16 on disk -> fp32 parameter). Destinations must be
/// contiguous, strided tensors of the stored shape; integer and bool tensors need the same
/// dtype. Destinations on a device (CUDA, ...) are read and verified into host buffers (pinned
/// for CUDA; as much host memory as those destinations, for the call), then copied to their
/// devices on a side stream ordered after the caller's current stream there; the call returns
/// once those copies are done, and a failed read leaves device destinations unwritten.
/// Key, shape and dtype problems are all found from the manifest, and every shard is opened
/// and size-checked, before any destination byte changes.
/// Errors: InvalidArgument(kKeyNotFound) listing destination keys the snapshot lacks;
/// InvalidArgument(kShapeMismatch) listing every shape/dtype mismatch; InvalidArgument for a
/// non-contiguous, non-strided or meta destination, or an atomic load larger than the read
/// budget; Error(kUnsupported) when a device destination's host buffer cannot be allocated;
/// IoError(kIo) naming the key when a copy to a device fails; those of `load`. A hash or I/O
/// failure found while reading says which destination tensors were already written: their
/// contents are then undefined (a chunk is verified as it is copied, so the failing chunk's
/// bytes may have landed too); load again, e.g. an older snapshot. With `atomic`, nothing is
/// written unless every chunk is verified first.
/// Thread-safety: `dest`'s tensors must not be used by other threads during the call.
/// Ownership: writes into `dest`'s storage; `dest` itself (its keys) is not changed.
TSNAP_API LoadReport load_into(const std::filesystem::path& path, StateDict& dest,
                               const LoadOptions& options = {});

/// `tsnap::load` from a hot snapshot (tsnap/hot_snapshot.h), in memory: new CPU tensors in
/// their stored dtype, bit-identical to a load of the directory. Same options and semantics as
/// the disk version; the read options (engine, direct_io, io_threads, read_budget_bytes) do not
/// apply: nothing is read.
/// Errors: InvalidArgument for an empty handle; IoError(kNotFound) once evicted;
/// FormatError(kHashMismatch) naming file and chunk for a corrupt buffer (with
/// `verify`, the default); those of `tsnap::load` for patterns. Thread-safe.
/// Ownership: the returned tensors are new and owned by the caller.
TSNAP_API StateDict load(const HotSnapshot& snapshot, const LoadOptions& options = {});

/// `tsnap::load_into` from a hot snapshot, in memory: the same checks before any destination
/// byte changes, the same conversions, the same report (`engine` is "memory", `bytes_read` the
/// bytes verified). With `atomic`, every selected chunk is verified before any destination is
/// written; this needs no read buffers (the bytes are in memory already), so read_budget_bytes
/// does not bound it. Errors: those of `load(const HotSnapshot&)` and of `tsnap::load_into`.
/// Thread-safety and ownership: as tsnap::load_into.
TSNAP_API LoadReport load_into(const HotSnapshot& snapshot, StateDict& dest,
                               const LoadOptions& options = {});

/// One chunk that failed verification.
struct TSNAP_API BadChunk {
  std::string file;
  uint64_t chunk = 0;   ///< Chunk index in the file.
  uint64_t offset = 0;  ///< Its byte offset.
  std::string problem;  ///< "hash mismatch", "truncated", "missing file", ...
};

/// Re-hashes every chunk of every shard. Returns the bad ones (empty = intact).
/// Errors: those of read_manifest (a snapshot without a valid manifest cannot be verified).
TSNAP_API std::vector<BadChunk> verify(const std::filesystem::path& path);

}  // namespace tsnap
