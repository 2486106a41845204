#include "restore/read_chunks.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "common/anon_memory.h"
#include "common/progress_meter.h"
#include "common/sys_error.h"
#include "common/thread_name.h"
#include "format/convert.h"
#include "format/dtype.h"
#include "format/hash.h"
#include "format/safetensors.h"
#include "io/engine_host.h"
#include "io/fd.h"
#include "restore/chunk_source.h"
#include "restore/shard_reader.h"
#include "tsnap/error.h"

namespace tsnap::restore {
namespace {

constexpr uint64_t kAlign = 4096;                       // O_DIRECT length and buffer alignment
constexpr uint64_t kMaxChunk = format::kMaxChunkBytes;  // engine reads report an int length
constexpr double kMostlyCached = 0.5;                   // read such a file through the page cache
constexpr size_t kMaxNamed = 100;                       // names listed in a mid-stream error
// A verified chunk is hashed and copied in pieces of this size, each copied while the hash has
// just brought it into the cache (L2), instead of hashing all of it and then reading it again.
constexpr uint64_t kHashPiece = 256ull << 10;

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A shard of the plan: checked against the manifest, and the descriptor its chunks are read
// from (an extra O_DIRECT one where used).
struct OpenShard {
  std::unique_ptr<ShardReader> reader;
  io::UniqueFd direct;
  int fd() const { return direct.valid() ? direct.get() : reader->fd(); }
};

// A finished read: the job (index into plan.chunks), its buffer and the engine's result.
struct Completion {
  size_t job = 0;
  int buf = 0;
  int result = 0;
};

// The read buffers of one load: aligned, and each faulted in right before its first read (left
// to the read, each page of fresh memory was faulted in inside it, on the io path). In huge
// pages for O_DIRECT reads: each read pins its buffer's pages, 4,096 of them per 16 MiB in
// 4 KiB pages; measured on the 2-core VM (tsnap_bench_restore, cold load_into of 1.5 GB): 0.89 s
// with 4 KiB pages faulted by the reads, 0.76 s populated first, 0.50-0.52 s in huge pages
// populated first (a read into huge pages not populated first ran 4-10x slower:
// common/anon_memory.h). All of them faulted in before the first read took 0.01-0.56 s for
// 256 MiB, as the host pleased; buffer by buffer, the first read starts at once and the others'
// faults overlap the reads in flight. Not for reads through the page cache, whose verified copy
// out of huge pages measured slower (0.29-0.32 s against 0.22-0.29 s warm).
class ReadBuffers {
 public:
  ReadBuffers(size_t count, uint64_t bytes, bool huge)
      : memory_(count * bytes, huge, "read buffers"), bytes_(bytes), ready_(count, 0) {}
  uint8_t* data(int i) const { return memory_.data() + static_cast<uint64_t>(i) * bytes_; }
  // Faults buffer `i` in unless done before. Called by the buffer's user (one at a time) right
  // before it submits a read into it, so that the first reads start at once and the rest of
  // the buffers are faulted in while they are in flight.
  void prepare(int i) const {
    if (ready_[i]) return;
    detail::populate(data(i), bytes_);
    ready_[i] = 1;
  }

 private:
  detail::AnonMemory memory_;
  uint64_t bytes_;
  mutable std::vector<uint8_t> ready_;  // per buffer; each written only by its current user
};

// The pieces of `c` that need no conversion, in chunk order, when a read can put them
// straight into their targets: they do not overlap, and with the gaps between them they make
// at most IOV_MAX segments. Empty otherwise (or when there are none).
std::vector<size_t> in_place_pieces(const ChunkRead& c, const std::vector<Target>& targets) {
  std::vector<size_t> out;
  for (size_t i = 0; i < c.pieces.size(); ++i) {
    const Target& t = targets[c.pieces[i].target];
    if (t.record->dtype == t.dtype && c.pieces[i].len > 0) out.push_back(i);
  }
  if (2 * out.size() + 1 > IOV_MAX) return {};
  std::sort(out.begin(), out.end(),
            [&](size_t a, size_t b) { return c.pieces[a].chunk_off < c.pieces[b].chunk_off; });
  for (size_t k = 1; k < out.size(); ++k) {
    const Piece &prev = c.pieces[out[k - 1]], &p = c.pieces[out[k]];
    if (prev.chunk_off + prev.len > p.chunk_off) return {};
  }
  return out;
}

// Calls fn(pointer, length) for the bytes of chunk `c` in order: the pieces `direct` (from
// in_place_pieces) in their targets, the rest in `buf` at their offset in the chunk.
// `Byte` is uint8_t to read into them, const uint8_t to hash them.
template <typename Byte, typename Fn>
void for_each_segment(const ChunkRead& c, const std::vector<size_t>& direct, Byte* buf,
                      const std::vector<Target>& targets, Fn&& fn) {
  uint64_t at = 0;
  for (size_t i : direct) {
    const Piece& p = c.pieces[i];
    if (p.chunk_off > at) fn(buf + at, p.chunk_off - at);
    fn(static_cast<Byte*>(targets[p.target].data) + p.dest_off, p.len);
    at = p.chunk_off + p.len;
  }
  if (c.length > at) fn(buf + at, c.length - at);
}

// Chunks of files read through the page cache, unless the load is atomic, are read in place
// (ChunkSource::in_place): the kernel's copy out of the page cache is then the only copy of
// the bytes that need no conversion, instead of a copy into a read buffer and another out of
// it. The hash is computed over the targets' bytes after the read, as it would be over the
// buffer's. Measured warm (tsnap_bench_restore, 1.5 GB, files in the page cache): load_into
// with verify off 0.17-0.22 s through the buffers, 0.10-0.12 s in place; verified 0.19-0.37 s
// and 0.14-0.27 s (hashing each 256 KiB right after its read measured no faster).
class FileChunks : public ChunkSource {
 public:
  FileChunks(const ReadPlan& plan, const std::vector<OpenShard>& shards, io::Engine& engine,
             const ReadBuffers& buffers, const std::vector<Target>& targets, bool atomic)
      : plan_(plan), shards_(shards), engine_(engine), buffers_(buffers), targets_(targets) {
    in_place_.resize(plan.chunks.size());
    for (size_t j = 0; j < plan.chunks.size() && !atomic; ++j) {
      if (!shards[plan.chunks[j].file].direct.valid()) {
        in_place_[j] = in_place_pieces(plan.chunks[j], targets);
      }
    }
  }
  void fetch(size_t job, int slot, io::Done done) override {
    const ChunkRead& c = plan_.chunks[job];
    const OpenShard& s = shards_[c.file];
    buffers_.prepare(slot);
    if (const std::vector<size_t>* direct = in_place(job)) {
      std::vector<iovec> iov;
      iov.reserve(2 * direct->size() + 1);
      for_each_segment(c, *direct, buffers_.data(slot), targets_, [&](uint8_t* p, uint64_t len) {
        iov.push_back({p, len});
      });
      engine_.readv(s.fd(), iov.data(), static_cast<int>(iov.size()), c.offset, std::move(done));
      return;
    }
    // O_DIRECT reads whole blocks; the last chunk of a file then simply reads short.
    const uint64_t len = s.direct.valid() ? align_up(c.length) : c.length;
    engine_.read(s.fd(), buffers_.data(slot), len, c.offset, -1, std::move(done));
  }
  const uint8_t* data(size_t, int slot) const override { return buffers_.data(slot); }
  const ChunkCheck& check(size_t file) const override { return *shards_[file].reader; }
  const std::vector<size_t>* in_place(size_t job) const override {
    return in_place_[job].empty() ? nullptr : &in_place_[job];
  }

 private:
  const ReadPlan& plan_;
  const std::vector<OpenShard>& shards_;
  io::Engine& engine_;
  const ReadBuffers& buffers_;
  const std::vector<Target>& targets_;
  std::vector<std::vector<size_t>> in_place_;  // per job: in_place_pieces, empty: not in place
};

// Copies (or converts) bytes [lo, hi) of the chunk in `buf` into the targets of its pieces
// that overlap them, and counts the bytes written per target. `lo` and `hi` fall on element
// boundaries of every converted piece: they are 0, the chunk's length, or multiples of kHashPiece,
// and a converted tensor starts at a multiple of its element size in the file as every chunk does.
// With `converted_only`, the pieces that need no conversion are left alone (read in place).
void scatter(const ChunkRead& c, const uint8_t* buf, uint64_t lo, uint64_t hi,
             const std::vector<Target>& targets, std::vector<std::atomic<uint64_t>>& written,
             bool converted_only = false) {
  for (const Piece& p : c.pieces) {
    const Target& t = targets[p.target];
    const uint64_t a = std::max(lo, p.chunk_off);
    const uint64_t b = std::min(hi, p.chunk_off + p.len);
    if (a >= b) continue;
    const at::ScalarType from = t.record->dtype;
    if (converted_only && from == t.dtype) continue;
    const uint8_t* src = buf + a;
    const uint64_t dest_off = p.dest_off + (a - p.chunk_off);
    if (from == t.dtype) {
      std::memcpy(static_cast<uint8_t*>(t.data) + dest_off, src, b - a);
    } else {
      const uint64_t in = format::element_size(from);
      uint8_t* dst = static_cast<uint8_t*>(t.data) + dest_off / in * format::element_size(t.dtype);
      format::convert(src, from, dst, t.dtype, (b - a) / in);
    }
    written[p.target].fetch_add(b - a, std::memory_order_relaxed);
  }
}

// Runs `work` on the calling thread and on up to `extra` more threads, and joins them. Never
// throws for a thread that cannot be started (the calling thread does the work then).
void on_threads(size_t extra, const std::function<void()>& work) {
  std::vector<std::thread> threads;
  for (size_t i = 0; i < extra; ++i) {
    try {
      threads.emplace_back([&work] {
        detail::name_this_thread("tsnap-read");
        work();
      });
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (std::thread& t : threads) t.join();
}

// One load's reads in flight. Processors (the calling thread and helpers) take finished reads
// one at a time, check and scatter them, and reuse each buffer for the next read. Nothing here
// throws: the first error (by chunk order) is kept, and stops new reads.
class Reads {
 public:
  Reads(const ReadPlan& plan, const std::vector<Target>& targets, ChunkSource& source,
        const LoadOptions& options)
      : plan_(plan),
        targets_(targets),
        source_(source),
        options_(options),
        written_(targets.size()),
        progress_(options.progress, plan.bytes) {}

  // Submits the next chunk's read into buffer `buf`, unless none is left or the run stopped.
  void submit(int buf) {
    size_t job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_ || next_ == plan_.chunks.size()) return;
      job = next_++;
      ++pending_;
    }
    source_.fetch(job, buf, [this, job, buf](int result) {
      // Notified under the lock: once it is released, a processor may take this last read,
      // return, and the load destroy cv_ while this (io) thread would still be notifying.
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back({job, buf, result});
      cv_.notify_one();
    });
  }

  // A processor's loop: returns when every read submitted is back and no more will be.
  void process() {
    format::Hash64Stream hash;
    for (;;) {
      Completion d;
      bool skip;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !ready_.empty() || finished(); });
        if (ready_.empty()) return;
        d = ready_.front();
        ready_.pop_front();
        --pending_;
        skip = stopped_;
      }
      if (!skip) {
        try {
          count_in_place(d);
          check_length(d);
          if (options_.atomic) {
            check_hash(d);
          } else {
            hash_and_scatter(d, hash);
          }
          progress_.done(plan_.chunks[d.job].length, /*also_staged=*/true);
        } catch (...) {
          fail(d.job, std::current_exception());
        }
      }
      if (options_.atomic) {
        std::lock_guard<std::mutex> lock(mu_);
        deferred_.push_back(d);
      } else {
        submit(d.buf);
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (finished()) cv_.notify_all();  // let the other processors leave
    }
  }

  // Atomic loads, once every chunk is verified: scatters them all.
  void scatter_deferred(size_t extra_threads) {
    std::atomic<size_t> next{0};
    on_threads(extra_threads, [&] {
      for (size_t i; (i = next++) < deferred_.size();) {
        const Completion& d = deferred_[i];
        const ChunkRead& c = plan_.chunks[d.job];
        scatter(c, source_.data(d.job, d.buf), 0, c.length, targets_, written_);
      }
    });
  }

  std::exception_ptr error() const { return error_; }
  const std::vector<std::atomic<uint64_t>>& written() const { return written_; }

 private:
  bool finished() const { return pending_ == 0 && (stopped_ || next_ == plan_.chunks.size()); }

  // The result of a finished read: an error, or a chunk cut short (truncation).
  void check_length(const Completion& d) const {
    const ChunkRead& c = plan_.chunks[d.job];
    const ChunkCheck& r = source_.check(c.file);
    if (d.result < 0) {
      if (const std::exception_ptr e = source_.failure(d.job)) std::rethrow_exception(e);
      detail::throw_sys_error(d.result, "read " + r.path() + " chunk " + std::to_string(c.chunk) +
                                            " at offset " + std::to_string(c.offset));
    }
    if (static_cast<uint64_t>(d.result) < c.length) {
      r.throw_short_chunk(c.chunk, c.offset + static_cast<uint64_t>(d.result));
    }
  }

  // The hash of a finished read, before any of it is scattered (atomic loads).
  void check_hash(const Completion& d) const {
    const ChunkRead& c = plan_.chunks[d.job];
    const ChunkCheck& r = source_.check(c.file);
    if (options_.verify && !r.chunk_ok(c.chunk, source_.data(d.job, d.buf), c.length)) {
      r.throw_hash_mismatch(c.chunk);
    }
  }

  // Hashes (with verify) and scatters a finished read piece by piece, so that each piece is
  // copied while the hash has it in the cache; then checks the hash. A chunk that fails it has
  // been copied into its targets, which the error then names as written.
  void hash_and_scatter(const Completion& d, format::Hash64Stream& hash) {
    const ChunkRead& c = plan_.chunks[d.job];
    if (const std::vector<size_t>* direct = source_.in_place(d.job)) {
      const uint8_t* buf = source_.data(d.job, d.buf);
      scatter(c, buf, 0, c.length, targets_, written_, /*converted_only=*/true);
      if (!options_.verify) return;
      hash.reset();
      for_each_segment(c, *direct, buf, targets_,
                       [&](const uint8_t* p, uint64_t len) { hash.update(p, len); });
      const ChunkCheck& r = source_.check(c.file);
      if (!r.hash_ok(c.chunk, hash.digest())) r.throw_hash_mismatch(c.chunk);
      return;
    }
    const uint8_t* data = source_.data(d.job, d.buf);
    if (!options_.verify) {
      scatter(c, data, 0, c.length, targets_, written_);
      return;
    }
    hash.reset();
    for (uint64_t lo = 0; lo < c.length; lo += kHashPiece) {
      const uint64_t hi = std::min(c.length, lo + kHashPiece);
      hash.update(data + lo, hi - lo);
      scatter(c, data, lo, hi, targets_, written_);
    }
    const ChunkCheck& r = source_.check(c.file);
    if (!r.hash_ok(c.chunk, hash.digest())) r.throw_hash_mismatch(c.chunk);
  }

  // A read in place has written its pieces' targets as far as it got, whatever follows.
  void count_in_place(const Completion& d) {
    const std::vector<size_t>* direct = source_.in_place(d.job);
    if (direct == nullptr || d.result <= 0) return;
    const ChunkRead& c = plan_.chunks[d.job];
    const uint64_t got = static_cast<uint64_t>(d.result);
    for (size_t i : *direct) {
      const Piece& p = c.pieces[i];
      if (p.chunk_off >= got) break;
      written_[p.target].fetch_add(std::min(p.len, got - p.chunk_off), std::memory_order_relaxed);
    }
  }

  void fail(size_t job, std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_ || job < error_job_) {
        error_ = std::move(e);
        error_job_ = job;
      }
      stopped_ = true;
    }
    cv_.notify_all();
  }

  const ReadPlan& plan_;
  const std::vector<Target>& targets_;
  ChunkSource& source_;
  const LoadOptions& options_;
  std::vector<std::atomic<uint64_t>> written_;
  detail::ProgressMeter progress_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Completion> ready_;  // finished reads not yet taken by a processor
  size_t next_ = 0;               // next job to submit
  size_t pending_ = 0;            // submitted and not yet taken
  bool stopped_ = false;          // an error was found: submit nothing more
  std::exception_ptr error_;
  size_t error_job_ = 0;
  std::vector<Completion> deferred_;  // atomic: verified chunks, scattered at the end
};

// "; 2 of 4 destination tensors were already written: a, b (partly)".
std::string written_note(const std::vector<Target>& targets,
                         const std::vector<std::atomic<uint64_t>>& written) {
  std::vector<std::string> names;
  for (size_t i = 0; i < targets.size(); ++i) {
    const uint64_t w = written[i].load();
    if (w == 0 || targets[i].stand_in) continue;
    names.push_back(targets[i].record->name + (w < targets[i].stored_bytes() ? " (partly)" : ""));
  }
  if (names.empty()) return "; no destination tensor was written";
  std::string note = "; " + std::to_string(names.size()) + " of " + std::to_string(targets.size()) +
                     " destination tensors were already written: ";
  for (size_t i = 0; i < names.size() && i < kMaxNamed; ++i) {
    note += (i ? ", " : "") + names[i];
  }
  if (names.size() > kMaxNamed) {
    note += ", and " + std::to_string(names.size() - kMaxNamed) + " more";
  }
  return note;
}

// Rethrows `e` with `note` appended to its message, keeping its code (and so its class) and
// errno.
[[noreturn]] void rethrow_with(const std::exception_ptr& e, const std::string& note) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    throw_error(x.code(), x.what() + note, x.sys_errno());
  }
}

// The new tensors of a load (tsnap::load, not in place), faulted in on a thread of their own
// in the order the reads fill them, while the reads are in flight. Left to the copies out of
// the read buffers, every 4 KiB page of them was faulted in by the processor that copies into
// it, on the path of the reads. Measured (tsnap_bench_restore, cold, 1.5 GB): load 0.77 s
// against load_into's 0.62 s without; with the destinations in huge pages instead, 0.87 s cold
// and 2.8 s warm (on this VM the host backs each fresh 2 MiB page slowly). The processors still
// fault in what this thread has not reached; it stops with the load.
class Prefault {
 public:
  Prefault(const ReadPlan& plan, const std::vector<Target>& targets) {
    std::vector<bool> seen(targets.size(), false);
    for (const ChunkRead& c : plan.chunks) {
      for (const Piece& p : c.pieces) {
        const Target& t = targets[p.target];
        if (seen[p.target] || !t.runs.empty()) continue;
        seen[p.target] = true;
        const uint64_t bytes = t.stored_bytes() / format::element_size(t.record->dtype) *
                               format::element_size(t.dtype);
        if (bytes >= kMinBytes) regions_.push_back({static_cast<uint8_t*>(t.data), bytes});
      }
    }
    if (regions_.empty()) return;
    try {
      thread_ = std::thread([this] {
        detail::name_this_thread("tsnap-fault");
        run();
      });
    } catch (const std::system_error&) {
      // no thread: the copies fault the pages in
    }
  }
  ~Prefault() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  Prefault(const Prefault&) = delete;
  Prefault& operator=(const Prefault&) = delete;

 private:
  static constexpr uint64_t kMinBytes = 1ull << 20;   // smaller ones are mostly reused memory
  static constexpr uint64_t kStepBytes = 8ull << 20;  // how often it looks at stop_

  // In-kernel only: the processors write these bytes meanwhile. Where the kernel cannot, the
  // copies fault them in as before.
  void run() {
    for (const auto& [p, bytes] : regions_) {
      for (uint64_t at = 0; at < bytes && !stop_; at += kStepBytes) {
        if (!detail::populate_untouched(p + at, std::min(kStepBytes, bytes - at))) return;
      }
    }
  }

  std::vector<std::pair<uint8_t*, uint64_t>> regions_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

// Runs the reads of `plan` from `source` with `slots` fetches at once and `extra` processor
// threads besides this one, then (atomic) scatters them; throws the first error.
void run_reads(const ReadPlan& plan, const std::vector<Target>& targets, ChunkSource& source,
               const LoadOptions& options, bool in_place, size_t slots, size_t extra) {
  Reads reads(plan, targets, source, options);
  for (size_t b = 0; b < slots; ++b) reads.submit(static_cast<int>(b));
  std::optional<Prefault> prefault;
  if (!in_place) prefault.emplace(plan, targets);
  // From here until every read is back, nothing throws: the reads use this frame.
  on_threads(extra, [&] { reads.process(); });
  prefault.reset();
  if (const std::exception_ptr error = reads.error()) {
    rethrow_with(error, in_place && !options.atomic ? written_note(targets, reads.written()) : "");
  }
  if (options.atomic) reads.scatter_deferred(extra);
}

size_t read_slots(const ReadPlan& plan, const LoadOptions& options, uint64_t buf_bytes) {
  if (plan.max_chunk_length > kMaxChunk) {
    throw_error(ErrorCode::kUnsupported, "a chunk of " + std::to_string(plan.max_chunk_length) +
                                             " bytes is larger than the reader's limit of " +
                                             std::to_string(kMaxChunk));
  }
  const size_t n = plan.chunks.size();
  if (!options.atomic) {
    return static_cast<size_t>(
        std::clamp<uint64_t>(options.read_budget_bytes / std::max<uint64_t>(buf_bytes, 1), 1, n));
  }
  if (n * buf_bytes > options.read_budget_bytes) {
    throw_error(ErrorCode::kInvalidArgument,
                "an atomic load of these keys stages " + std::to_string(n) + " chunks (" +
                    std::to_string(n * buf_bytes) + " bytes), more than read_budget_bytes (" +
                    std::to_string(options.read_budget_bytes) +
                    "): raise the budget or select fewer keys");
  }
  return n;
}

OpenedShards open_shards(const format::SnapshotDir& dir, const Manifest& manifest,
                         const std::vector<const TensorRecord*>& records) {
  std::map<std::string, const FileRecord*> files;
  for (const FileRecord& f : manifest.files) files.emplace(f.name, &f);
  OpenedShards opened;
  for (const TensorRecord* r : records) {
    if (opened.count(r->file)) continue;
    opened.emplace(r->file, std::make_unique<ShardReader>(dir, *files.at(r->file), manifest));
  }
  return opened;
}

ReadStats read_chunks(const format::SnapshotDir& dir, const Manifest& manifest,
                      const std::vector<Target>& targets, const ReadPlan& plan,
                      const LoadOptions& options, bool in_place, OpenedShards* opened) {
  ReadStats stats;
  if (plan.chunks.empty()) return stats;
  const uint64_t buf_bytes = align_up(plan.max_chunk_length);
  size_t count = read_slots(plan, options, buf_bytes);

  // Open and check every shard before anything is read or written (unless the caller did).
  std::vector<OpenShard> shards(plan.files.size());
  for (size_t i = 0; i < plan.files.size(); ++i) {
    if (opened != nullptr) {
      const auto it = opened->find(plan.files[i]->name);
      if (it != opened->end() && &it->second->file() == plan.files[i]) {
        shards[i].reader = std::move(it->second);
        opened->erase(it);
        continue;
      }
    }
    shards[i].reader = std::make_unique<ShardReader>(dir, *plan.files[i], manifest);
  }
  bool direct = options.direct_io;
  for (OpenShard& s : shards) {
    if (!direct || s.reader->cached_fraction() >= kMostlyCached) continue;
    // The same file again (even if the name was overwritten and it is unlinked since), now
    // with O_DIRECT: through /proc/self/fd where mounted, else relative to the directory.
    int err = 0;
    s.direct = io::open_fd("/proc/self/fd/" + std::to_string(s.reader->fd()), O_RDONLY | O_DIRECT,
                           0, &err);
    if (err == -ENOENT) {
      struct stat st {};
      s.direct = io::open_for_reading(s.reader->file().name, O_DIRECT, &st, &err, dir.fd.get());
      if (err == -ENOENT) {
        throw_error(ErrorCode::kNotFound, "shard " + s.reader->path() + " does not exist", ENOENT);
      }
    }
    if (err == -EINVAL) {
      direct = false;  // the filesystem refuses O_DIRECT (older tmpfs, some network
                       // filesystems): read through the page cache
    } else if (err < 0) {
      detail::throw_sys_error(err, "open " + s.reader->path() + " with O_DIRECT");
    }
  }
  const bool any_direct = std::any_of(shards.begin(), shards.end(),
                                      [](const OpenShard& s) { return s.direct.valid(); });
  io::EngineRequest request;
  request.kind = options.engine;
  request.queue_depth = static_cast<unsigned>(std::min<size_t>(count, 128));
  request.io_threads = options.io_threads;
  const std::unique_ptr<io::EngineHost> host = io::host_for_load(request, any_direct);
  io::Engine& engine = host->engine();
  stats.engine = host->name();

  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  if (!any_direct && !options.atomic) {
    // Reads through the page cache are copies, not waits: one buffer per processor keeps
    // them cache-friendly, and no more threads run than there are cores.
    count = std::min(count, cores);
  }
  const size_t extra = std::min(count, cores) - 1;  // processor threads besides this one

  // Not registered with io_uring: buffers live for one load, and registering pins all of them
  // before the first read, which costs more than it saves here.
  const ReadBuffers buffers(count, buf_bytes, /*huge=*/any_direct);
  FileChunks source(plan, shards, engine, buffers, targets, options.atomic);
  run_reads(plan, targets, source, options, in_place, count, extra);
  stats.bytes = plan.bytes;
  return stats;
}

}  // namespace tsnap::restore
