#pragma once
// The read planner: which chunks of which shard files a restore reads, and where each byte of
// them goes. Chunks are the unit of reading because they are the unit of hashing: a chunk is
// read whole, verified, then scattered into the destinations of the tensors it overlaps.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "restore/reshard.h"
#include "tsnap/manifest.h"

namespace tsnap::restore {

/// Name -> record for one manifest, built once (Manifest::find is a linear scan).
/// The manifest must outlive the index.
using RecordIndex = std::unordered_map<std::string_view, const TensorRecord*>;
RecordIndex index_records(const Manifest& manifest);
/// Name -> every record of that name (several for a key stored as pieces), in manifest order.
using PieceIndex = std::unordered_map<std::string_view, std::vector<const TensorRecord*>>;
PieceIndex index_pieces(const Manifest& manifest);

/// Where one stored tensor's elements go: `data` holds elements of `dtype`, which is the stored
/// dtype or, when both are floating, another floating dtype. Without `runs`, data holds all
/// record->numel() elements in order; with them (resharding), only the runs are read, each to
/// its element offset in data.
struct Target {
  const TensorRecord* record = nullptr;
  void* data = nullptr;
  at::ScalarType dtype = at::kFloat;
  std::vector<Run> runs;
  /// `data` is a host stand-in for a destination on a device, which is written only after
  /// every read has succeeded: a failed read does not name it as written.
  bool stand_in = false;
  /// Stored bytes this target reads.
  uint64_t stored_bytes() const;
};

/// A run of one target's stored bytes inside a chunk.
struct Piece {
  size_t target = 0;       ///< Index into the targets.
  uint64_t chunk_off = 0;  ///< Byte offset inside what is read of the chunk.
  uint64_t dest_off = 0;   ///< Where it goes in the target's data, in stored-dtype bytes.
  uint64_t len = 0;        ///< Bytes, in the stored dtype.
};

/// One chunk to read and what to do with it.
struct ChunkRead {
  size_t file = 0;      ///< Index into ReadPlan::files.
  uint64_t chunk = 0;   ///< Chunk index in the file.
  uint64_t offset = 0;  ///< Byte offset in the file of what is read (the chunk's, if whole).
  uint64_t length = 0;  ///< Bytes read (the chunk's length, if whole).
  std::vector<Piece> pieces;
};

/// Every chunk a restore reads, in file order, each file's chunks ascending (sequential reads).
struct ReadPlan {
  std::vector<const FileRecord*> files;
  std::vector<ChunkRead> chunks;
  uint64_t max_chunk_length = 0;
  uint64_t bytes = 0;  ///< Sum of the read lengths.
};

/// Plans the reads of `targets` (records of `manifest`). Empty tensors read nothing.
/// `whole_chunks` reads every chunk whole (needed to verify its hash); otherwise only the
/// 4096-aligned span of a chunk that the targets need is read.
/// Errors: FormatError(kBadOffsets) when a target that needs a dtype conversion is not aligned
/// to its element size in the file (tsnap writers always align; see docs/format.md).
ReadPlan plan_reads(const Manifest& manifest, const std::vector<Target>& targets,
                    bool whole_chunks);

}  // namespace tsnap::restore
