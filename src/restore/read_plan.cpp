#include "restore/read_plan.h"

#include <algorithm>
#include <map>
#include <utility>

#include "format/dtype.h"
#include "tsnap/error.h"

namespace tsnap::restore {
namespace {

constexpr uint64_t kBlock = 4096;

}  // namespace

uint64_t Target::stored_bytes() const {
  if (runs.empty()) return record->nbytes();
  uint64_t n = 0;
  for (const Run& r : runs) n += r.n;
  return n * format::element_size(record->dtype);
}

RecordIndex index_records(const Manifest& manifest) {
  RecordIndex index;
  index.reserve(manifest.tensors.size());
  for (const TensorRecord& t : manifest.tensors) index.emplace(t.name, &t);
  return index;
}

PieceIndex index_pieces(const Manifest& manifest) {
  PieceIndex index;
  index.reserve(manifest.tensors.size());
  for (const TensorRecord& t : manifest.tensors) index[t.name].push_back(&t);
  return index;
}

ReadPlan plan_reads(const Manifest& manifest, const std::vector<Target>& targets,
                    bool whole_chunks) {
  ReadPlan plan;
  std::map<std::string_view, size_t> file_index;
  std::map<std::pair<size_t, uint64_t>, std::vector<Piece>> by_chunk;
  for (size_t i = 0; i < targets.size(); ++i) {
    const TensorRecord& t = *targets[i].record;
    if (t.begin == t.end) continue;
    const size_t elem = format::element_size(t.dtype);
    if (targets[i].dtype != t.dtype && t.begin % elem != 0) {
      throw_error(ErrorCode::kBadOffsets,
                  "tensor '" + t.name + "' starts at offset " + std::to_string(t.begin) + " of " +
                      t.file + ", not a multiple of its element size " + std::to_string(elem) +
                      ", so it cannot be converted chunk by chunk");
    }
    const auto [it, inserted] = file_index.emplace(t.file, plan.files.size());
    if (inserted) plan.files.push_back(manifest.find_file(t.file));
    const size_t file = it->second;  // a lambda may not capture a structured binding (C++17)
    const uint64_t cb = plan.files[file]->chunk_bytes;
    // Bytes [begin, end) of the file go to stored-dtype byte `dest` of the target's data.
    const auto add = [&](uint64_t begin, uint64_t end, uint64_t dest) {
      for (uint64_t c = begin / cb; c <= (end - 1) / cb; ++c) {
        const uint64_t lo = std::max(begin, c * cb);
        const uint64_t hi = std::min(end, (c + 1) * cb);
        by_chunk[{file, c}].push_back({i, lo - c * cb, dest + (lo - begin), hi - lo});
      }
    };
    if (targets[i].runs.empty()) {
      add(t.begin, t.end, 0);
    } else {
      for (const Run& r : targets[i].runs) {
        if (r.n != 0) add(t.begin + r.src * elem, t.begin + (r.src + r.n) * elem, r.dst * elem);
      }
    }
  }
  plan.chunks.reserve(by_chunk.size());
  for (auto& [key, pieces] : by_chunk) {
    const FileRecord& f = *plan.files[key.first];
    uint64_t offset = key.second * f.chunk_bytes;
    uint64_t length = std::min(f.size, offset + f.chunk_bytes) - offset;
    if (!whole_chunks) {
      uint64_t lo = length, hi = 0;
      for (const Piece& p : pieces) {
        lo = std::min(lo, p.chunk_off);
        hi = std::max(hi, p.chunk_off + p.len);
      }
      lo = lo / kBlock * kBlock;  // O_DIRECT reads whole blocks
      hi = std::min(length, (hi + kBlock - 1) / kBlock * kBlock);
      for (Piece& p : pieces) p.chunk_off -= lo;
      offset += lo;
      length = hi - lo;
    }
    plan.chunks.push_back({key.first, key.second, offset, length, std::move(pieces)});
    plan.max_chunk_length = std::max(plan.max_chunk_length, length);
    plan.bytes += length;
  }
  return plan;
}

}  // namespace tsnap::restore
