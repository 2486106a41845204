#pragma once
/// \file
/// `tsnap::Manifest`: the parsed, validated contents of a snapshot's MANIFEST.json (format v1,
/// docs/format.md). The commit marker of a snapshot and the index of its tensors and files.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/export.h"
#include "tsnap/state_dict.h"

namespace tsnap {

/// The format this build writes, and the newest it reads (it reads every version up to this
/// one). Version 3 requires the manifest's own checksum, which versions 1 and 2 may lack
/// (docs/format.md section 7).
inline constexpr int kFormatVersion = 3;
/// The manifest's `format` field.
inline constexpr const char* kFormatName = "tsnap";
/// The manifest's file name inside a snapshot directory.
inline constexpr const char* kManifestName = "MANIFEST.json";

/// One tensor of a snapshot.
struct TSNAP_API TensorRecord {
  std::string name;
  std::string file;             ///< Shard file name, relative to the snapshot directory.
  at::ScalarType dtype;         ///< Stored dtype.
  at::ScalarType source_dtype;  ///< Dtype of the tensor that was saved.
  std::vector<int64_t> shape;
  uint64_t begin = 0;              ///< Byte offset of the data in the shard file (absolute).
  uint64_t end = 0;                ///< One past the last byte (absolute).
  std::optional<ShardSpec> shard;  ///< Set for a rank's piece of a global tensor.
  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

/// One shard file of a snapshot.
struct TSNAP_API FileRecord {
  std::string name;
  uint64_t size = 0;         ///< Exact file size in bytes.
  uint64_t data_offset = 0;  ///< Where tensor data starts (multiple of 4096).
  uint64_t chunk_bytes = 0;  ///< Chunk size (multiple of 4096); the last chunk may be short.
  std::vector<uint64_t> chunk_hashes;  ///< XXH3-64 of each chunk, in file order.
  int rank = 0;                        ///< The rank that wrote it (distributed saves; 0 otherwise).
  /// Format v2: the save id in the file's own header when it is not the manifest's: the file
  /// keeps the layout (and header) of an earlier save's file, so that an incremental save can
  /// reuse that file when its bytes have not changed. Empty: the manifest's id.
  std::string tsnap_id;
  /// Format v2, informational: the snapshot whose file this save reused whole instead of
  /// writing it (a hard link to that file, or a copy where links are refused). Empty: this
  /// save wrote the file.
  std::string reused_from;
  /// The save id that the file's header must carry.
  const std::string& header_id(const std::string& manifest_id) const {
    return tsnap_id.empty() ? manifest_id : tsnap_id;
  }
};

/// The whole manifest. Value type; cheap enough to copy for tools.
struct TSNAP_API Manifest {
  /// As read (1, 2 or 3). Writers emit kFormatVersion whatever this says.
  int format_version = kFormatVersion;
  std::string id;  ///< Unique snapshot id (also in every shard's __metadata__).
  std::string tsnap_version;
  std::string torch_version;
  std::string created;  ///< ISO-8601 UTC creation time.
  int64_t created_unix_ns = 0;
  int world_size = 1;
  nlohmann::json metadata = nlohmann::json::object();  ///< The user's metadata.
  /// The training step the snapshot holds, when its saver said (SaveOptions::step).
  std::optional<int64_t> step;
  /// The previous snapshot of the same Snapshotter that this one was compared with (empty:
  /// none), and the keys whose stored bytes were identical there (sorted).
  std::string unchanged_since;
  std::vector<std::string> unchanged;
  /// Sorted by name. A key stored as several pieces (a distributed save of sharded state) has
  /// one record per piece, each with its `shard`, ordered by offsets.
  std::vector<TensorRecord> tensors;
  std::vector<FileRecord> files;

  /// The (first) record of `name`, or nullptr.
  const TensorRecord* find(const std::string& name) const;
  /// Every record of `name` (one unless it was stored as pieces); empty if there is none.
  std::vector<const TensorRecord*> pieces(const std::string& name) const;
  const FileRecord* find_file(const std::string& name) const;
  /// Sum of the shard file sizes.
  uint64_t total_bytes() const;
};

/// Reads and validates `<dir>/MANIFEST.json` (see docs/format.md for every check).
/// Errors: IoError(kNotFound) when missing; FormatError (kBadManifest, kUnsupportedFormat,
/// kUnsafePath, kBadOffsets) naming the file and the problem. Thread-safe.
TSNAP_API Manifest read_manifest(const std::filesystem::path& dir);

}  // namespace tsnap
