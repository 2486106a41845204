#include "restore/shard_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <vector>

#include "common/sys_error.h"
#include "format/dtype.h"
#include "format/hash.h"
#include "format/open_file.h"
#include "format/safetensors.h"
#include "tsnap/error.h"

namespace tsnap::restore {

ChunkCheck::ChunkCheck(const FileRecord& file, std::string path, std::string what)
    : file_(file), path_(std::move(path)), what_(std::move(what)) {}

ShardReader::ShardReader(const format::SnapshotDir& dir, const FileRecord& file,
                         const Manifest& manifest)
    : ChunkCheck(file, dir.label(file.name)) {
  format::OpenedFile opened = format::open_snapshot_file(dir, file.name, "shard");
  fd_ = std::move(opened.fd);
  const struct stat& st = opened.st;
  if (static_cast<uint64_t>(st.st_size) != file.size) {
    throw_error(ErrorCode::kTruncated,
                "shard " + path() + " is " + std::to_string(st.st_size) +
                    " bytes, the manifest says " + std::to_string(file.size) +
                    (static_cast<uint64_t>(st.st_size) < file.size ? " (truncated)" : ""));
  }
  // The shard's own header must describe the same tensors as the manifest.
  const format::Header header = format::read_header(fd_.get(), file.size, path());
  // Each shard names the save that wrote it (or, format v2, the earlier save whose layout it
  // keeps: FileRecord::tsnap_id): a manifest paired with another snapshot's shards (copied or
  // renamed by hand) is found here, before any chunk hash is computed.
  const std::string& expected_id = file.header_id(manifest.id);
  const auto id = header.metadata.find("tsnap_id");
  if (id == header.metadata.end() || id->second != expected_id) {
    throw_error(ErrorCode::kBadManifest,
                "shard " + path() + " was written by save " +
                    (id == header.metadata.end() ? std::string("(no tsnap_id)")
                                                 : "'" + format::printable(id->second) + "'") +
                    ", but the manifest expects save '" + format::printable(expected_id) +
                    "': the files come from different snapshots");
  }
  std::map<std::string, const format::HeaderTensor*> in_header;
  for (const format::HeaderTensor& t : header.tensors) in_header[t.name] = &t;
  size_t expected = 0;
  for (const TensorRecord& t : manifest.tensors) {
    if (t.file != file.name) continue;
    ++expected;
    auto it = in_header.find(t.name);
    const bool same = it != in_header.end() && it->second->dtype == t.dtype &&
                      it->second->shape == t.shape &&
                      it->second->begin + header.data_offset == t.begin &&
                      it->second->end + header.data_offset == t.end;
    if (!same) {
      throw_error(ErrorCode::kBadManifest, "shard " + path() + ": header entry of '" + t.name +
                                               "' disagrees with the manifest");
    }
  }
  if (expected != header.tensors.size() || header.data_offset != file.data_offset) {
    throw_error(ErrorCode::kBadManifest,
                "shard " + path() + ": header lists other tensors than the manifest");
  }
}

uint64_t ChunkCheck::chunk_length(uint64_t c) const {
  const uint64_t begin = c * file_.chunk_bytes;
  return std::min(file_.size, begin + file_.chunk_bytes) - begin;
}

uint64_t ShardReader::read_chunk(uint64_t c, uint8_t* buf, bool verify) const {
  const uint64_t begin = c * file().chunk_bytes;
  const uint64_t len = chunk_length(c);
  const int64_t got = io::read_full(fd_.get(), buf, len, begin);
  if (got < 0)
    detail::throw_sys_error(static_cast<int>(got),
                            "read " + path() + " at offset " + std::to_string(begin));
  if (static_cast<uint64_t>(got) < len) throw_short_chunk(c, begin + static_cast<uint64_t>(got));
  if (verify && !chunk_ok(c, buf, len)) throw_hash_mismatch(c);
  return len;
}

bool ChunkCheck::chunk_ok(uint64_t c, const uint8_t* buf, uint64_t len) const {
  return hash_ok(c, format::hash64(buf, len));
}

bool ChunkCheck::hash_ok(uint64_t c, uint64_t hash) const {
  return c < file_.chunk_hashes.size() && hash == file_.chunk_hashes[c];
}

void ChunkCheck::throw_hash_mismatch(uint64_t c) const {
  throw_error(ErrorCode::kHashMismatch,
              "shard " + path_ + ": chunk " + std::to_string(c) + " at offset " +
                  std::to_string(c * file_.chunk_bytes) + " (" + std::to_string(chunk_length(c)) +
                  " bytes) does not match its XXH3-64 hash: " + what_ + " is corrupt");
}

void ChunkCheck::throw_short_chunk(uint64_t c, uint64_t end) const {
  throw_error(ErrorCode::kTruncated, "shard " + path_ + " ends at offset " + std::to_string(end) +
                                         " inside chunk " + std::to_string(c) +
                                         "; the manifest says " + std::to_string(file_.size) +
                                         " bytes (truncated)");
}

double ShardReader::cached_fraction() const {
  const uint64_t size = file().size;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (size == 0) return 0;
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd_.get(), 0);
  if (map == MAP_FAILED) return 0;
  std::vector<unsigned char> resident((size + page - 1) / page);
  double fraction = 0;
  if (::mincore(map, size, resident.data()) == 0) {
    size_t in = 0;
    for (unsigned char r : resident) in += r & 1;
    fraction = static_cast<double>(in) / static_cast<double>(resident.size());
  }
  ::munmap(map, size);
  return fraction;
}

}  // namespace tsnap::restore
