#pragma once
// Executes a ReadPlan: the one read path of `load`, `load_into` and `verify`, from the shard
// files or, for a hot snapshot, from the staging buffers that hold its chunks
// (restore/read_hot_chunks.h: steps 3 and the atomic rule below apply the same, with nothing
// to read).
//
// 1. Open every shard of the plan (missing / truncated / disagreeing shards fail here, before
//    any destination byte changes), or take those the caller opened already, and read each with
//    O_DIRECT unless direct I/O is off, the filesystem refuses it, or the file is mostly in the
//    page cache already.
// 2. Keep up to `read_budget_bytes / chunk` whole-chunk reads in flight through an io::Engine
//    (io_uring, or a pread pool) into aligned buffers allocated for the load (through the page
//    cache, where reads are copies rather than waits, one buffer per core).
// 3. Processors (the calling thread plus one thread per further core) take finished reads one
//    at a time, check the length (truncation), then hash (XXH3-64) and copy or convert the
//    chunk into the targets piece by piece, each piece copied while the hash has it in the
//    cache, check the hash, and reuse the buffer for the next read.
// With `atomic` every chunk keeps its buffer until all are verified; only then are they
// scattered, so no unverified byte ever reaches a target. Without it, the first failure (a
// hash mismatch included: its chunk has been copied) stops new reads, the reads in flight are
// drained, and the error is rethrown, naming the targets already written.

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/open_file.h"
#include "restore/read_plan.h"
#include "restore/shard_reader.h"
#include "tsnap/load.h"

namespace tsnap::restore {

/// What a read did.
struct ReadStats {
  uint64_t bytes = 0;  ///< Bytes read (whole chunks).
  std::string engine;  ///< Engine name, "+O_DIRECT" when any file was read with it.
};

/// Shard files opened and checked already, by file name.
using OpenedShards = std::map<std::string, std::unique_ptr<ShardReader>>;

/// Opens (ShardReader: exists, exact size, header agrees with `manifest`) every file that holds
/// one of `records`, each once. Errors: those of ShardReader.
OpenedShards open_shards(const format::SnapshotDir& dir, const Manifest& manifest,
                         const std::vector<const TensorRecord*>& records);

/// Reads `plan` (made from `targets` of the manifest of the snapshot in `dir`) into `targets`.
/// Uses options.verify, atomic, read_budget_bytes, engine, direct_io and io_threads (the engine
/// comes from io::host_for_load). `in_place`: the targets are the caller's tensors, so a mid-stream
/// error names those already written. `opened`: shards of the plan opened by the caller (taken
/// from it; the others are opened here). Errors: as tsnap::load_into.
ReadStats read_chunks(const format::SnapshotDir& dir, const Manifest& manifest,
                      const std::vector<Target>& targets, const ReadPlan& plan,
                      const LoadOptions& options, bool in_place, OpenedShards* opened = nullptr);

}  // namespace tsnap::restore
