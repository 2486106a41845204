#pragma once
// The safetensors shard files of format v1 (docs/format.md): 8-byte little-endian header
// length N, N bytes of JSON header padded with spaces so that data starts at a multiple of
// 4096, then the tensor data with no holes.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tsnap::format {

/// Data alignment of v1 shards (and the O_DIRECT block size tsnap uses).
inline constexpr uint64_t kAlignment = 4096;
/// Largest chunk a snapshot may use (1 GiB): writers refuse bigger ones, readers reject them
/// (an engine transfer reports its length as an int, and a chunk is read into one buffer).
inline constexpr uint64_t kMaxChunkBytes = 1ull << 30;
/// Largest header a reader accepts (the safetensors reference caps at 100 MB too).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

/// One tensor entry of a header; offsets are relative to the start of the data section.
struct HeaderTensor {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

/// A header as built or parsed.
struct Header {
  uint64_t data_offset = 0;           ///< 8 + N: where the data section starts in the file.
  std::vector<HeaderTensor> tensors;  ///< In data order (begin ascending).
  std::map<std::string, std::string> metadata;  ///< The `__metadata__` string map.
};

/// Serialises a header: returns the first `data_offset` bytes of the file (length prefix + JSON
/// padded with spaces to a multiple of kAlignment). `tensors` must already be laid out
/// contiguously from offset 0 in the given order. Errors: InvalidArgument for an unsupported
/// dtype or a name that is empty, duplicated, "__metadata__" or not UTF-8; Error(kInternal) when
/// the tensors are not laid out contiguously.
std::string build_header(const std::vector<HeaderTensor>& tensors,
                         const std::map<std::string, std::string>& metadata);

/// Checks the 8-byte length prefix of a file of `file_size` bytes and returns 8 + N, the offset
/// of its data section. `prefix` holds the first min(file_size, 8) bytes (more are ignored).
/// Errors (FormatError naming `file`): fewer than 8 bytes or fewer than 8 + N (kTruncated),
/// N > kMaxHeaderBytes (kHeaderTooLarge).
uint64_t parse_length_prefix(const std::string& file, std::string_view prefix, uint64_t file_size);

/// Parses and validates a header from the first bytes of a file of `file_size` bytes.
/// `bytes` holds at least the first min(file_size, 8 + N) bytes (call parse_length_prefix with
/// the first 8 to learn N).
/// Checks (each a distinct FormatError naming `file`): length prefix present (kTruncated),
/// N <= kMaxHeaderBytes (kHeaderTooLarge), valid JSON object with valid entries (kBadHeader),
/// dtype*shape == byte length with overflow checks, ranges inside the file, no overlaps and no
/// holes (kBadOffsets).
Header parse_header(const std::string& file, std::string_view bytes, uint64_t file_size);

/// Reads and parses the header of the open file `fd` of `size` bytes (`label` names it).
/// Errors: those of parse_header; IoError(kIo) when it cannot be read.
Header read_header(int fd, uint64_t size, const std::string& label);

/// Opens `path` (as format/open_file.h opens snapshot files) and reads its header. Errors: those
/// of read_header and open_snapshot_file.
Header read_header(const std::filesystem::path& path);

}  // namespace tsnap::format
