#include "tsnap/load.h"

#include <ATen/ATen.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "restore/shard_reader.h"
#include "tsnap/error.h"
#include "util/glob.h"

namespace tsnap {
namespace {

// A chunk to read and the selected tensors that overlap it.
struct ChunkWork {
  size_t file;
  uint64_t chunk;
  std::vector<size_t> tensors;  // indices into `selected`
};

}  // namespace

StateDict load(const std::filesystem::path& path, const LoadOptions& options) {
  const Manifest m = read_manifest(path);
  std::vector<std::string> names;
  names.reserve(m.tensors.size());
  for (const TensorRecord& t : m.tensors) names.push_back(t.name);
  const std::vector<std::string> keys =
      detail::select_keys(names, options.include, options.exclude, /*strict=*/false);

  std::vector<const TensorRecord*> selected;
  std::vector<at::Tensor> out;
  for (const std::string& k : keys) {
    const TensorRecord* t = m.find(k);
    selected.push_back(t);
    out.push_back(at::empty(t->shape, at::TensorOptions().dtype(t->dtype)));
  }

  // Open every shard that holds a selected tensor, and list the chunks to read.
  std::map<std::string, size_t> file_index;
  std::vector<std::unique_ptr<restore::ShardReader>> readers;
  std::map<std::pair<size_t, uint64_t>, std::vector<size_t>> by_chunk;
  for (size_t i = 0; i < selected.size(); ++i) {
    const TensorRecord& t = *selected[i];
    auto [it, inserted] = file_index.emplace(t.file, readers.size());
    if (inserted) {
      readers.push_back(std::make_unique<restore::ShardReader>(path, *m.find_file(t.file), m));
    }
    const FileRecord& f = readers[it->second]->file();
    if (t.begin == t.end) continue;
    for (uint64_t c = t.begin / f.chunk_bytes; c <= (t.end - 1) / f.chunk_bytes; ++c) {
      by_chunk[{it->second, c}].push_back(i);
    }
  }
  std::vector<ChunkWork> work;
  for (auto& [key, tensors] : by_chunk) work.push_back({key.first, key.second, tensors});

  uint64_t max_chunk = 0;
  for (const auto& r : readers) max_chunk = std::max(max_chunk, r->file().chunk_bytes);
  tbb::enumerable_thread_specific<std::vector<uint8_t>> buffers(
      [&] { return std::vector<uint8_t>(max_chunk); });
  tbb::parallel_for(size_t{0}, work.size(), [&](size_t w) {
    const ChunkWork& cw = work[w];
    const restore::ShardReader& reader = *readers[cw.file];
    std::vector<uint8_t>& buf = buffers.local();
    const uint64_t len = reader.read_chunk(cw.chunk, buf.data(), options.verify);
    const uint64_t lo = cw.chunk * reader.file().chunk_bytes;
    const uint64_t hi = lo + len;
    for (size_t i : cw.tensors) {
      const TensorRecord& t = *selected[i];
      const uint64_t a = std::max(lo, t.begin);
      const uint64_t b = std::min(hi, t.end);
      if (a < b) {
        std::memcpy(static_cast<uint8_t*>(out[i].data_ptr()) + (a - t.begin),
                    buf.data() + (a - lo), b - a);
      }
    }
  });

  StateDict result;
  for (size_t i = 0; i < selected.size(); ++i) {
    StateEntry& e = result.insert(selected[i]->name, std::move(out[i]));
    e.shard = selected[i]->shard;
  }
  return result;
}

std::vector<BadChunk> verify(const std::filesystem::path& path) {
  const Manifest m = read_manifest(path);
  std::vector<BadChunk> bad;
  for (const FileRecord& f : m.files) {
    std::unique_ptr<restore::ShardReader> reader;
    try {
      reader = std::make_unique<restore::ShardReader>(path, f, m);
    } catch (const Error& e) {
      bad.push_back({f.name, 0, 0, e.what()});
      continue;
    }
    std::vector<uint8_t> buf(f.chunk_bytes);
    for (uint64_t c = 0; c < f.chunk_hashes.size(); ++c) {
      try {
        const uint64_t len = reader->read_chunk(c, buf.data(), /*verify=*/false);
        if (!reader->chunk_ok(c, buf.data(), len)) {
          bad.push_back({f.name, c, c * f.chunk_bytes, "hash mismatch"});
        }
      } catch (const Error& e) {
        bad.push_back({f.name, c, c * f.chunk_bytes, e.what()});
      }
    }
  }
  return bad;
}

}  // namespace tsnap
