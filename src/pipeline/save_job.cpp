#include "pipeline/save_job.h"

#include <fcntl.h>
#include <tbb/parallel_for.h>
#include <torch/version.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <filesystem>
#include <iostream>
#include <mutex>

#include "common/glob.h"
#include "common/sys_error.h"
#include "format/dtype.h"
#include "format/hash.h"
#include "format/layout.h"
#include "format/manifest_io.h"
#include "pipeline/rank_report.h"
#include "stage/fill.h"
#include "stage/staging_pool.h"
#include "tsnap/error.h"

#ifndef TSNAP_VERSION_STRING
#define TSNAP_VERSION_STRING "0.0.0"
#endif

namespace tsnap::pipeline {
namespace {

constexpr uint64_t kBlock = 4096;

uint64_t round_up(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

double seconds(SaveJob::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             SaveJob::Clock::now().time_since_epoch())
      .count();
}

}  // namespace

SaveJob::SaveJob(Resources& res, plan::Plan plan, CommitPaths paths, nlohmann::json metadata,
                 bool overwrite, std::shared_ptr<dist::Coordinator> coordinator,
                 Clock::time_point started, std::function<void(bool, Learned)> release_slot,
                 std::function<void()> on_completed, ProgressFn progress)
    : res_(res),
      plan_(std::move(plan)),
      paths_(std::move(paths)),
      metadata_(std::move(metadata)),
      overwrite_(overwrite),
      coordinator_(std::move(coordinator)),
      started_(started),
      release_slot_(std::move(release_slot)),
      on_completed_(std::move(on_completed)),
      state_(std::make_shared<detail::SaveState>()),
      progress_(std::move(progress), plan_.total_bytes) {
  state_->path = paths_.final;
  SaveStats& s = state_->stats;
  s.engine = res_.host->engine().name();
  s.direct = res_.host->direct();
  s.files = plan_.written_files;
  for (size_t f = 0; f < plan_.written_files; ++f) s.chunks += plan_.files[f].num_chunks();
  s.tensors = plan_.num_tensors;
  s.tensor_bytes = plan_.tensor_bytes;
  hashes_.resize(plan_.files.size());
  skipped_.resize(plan_.files.size());
  base_files_.resize(plan_.files.size());
  reused_whole_.assign(plan_.files.size(), false);
  for (size_t f = 0; f < plan_.files.size(); ++f) {
    hashes_[f].assign(plan_.files[f].num_chunks(), 0);
    skipped_[f].assign(plan_.files[f].num_chunks(), 0);
  }
  {
    piece_hashes_.resize(plan_.files.size());
    for (size_t f = 0; f < plan_.files.size(); ++f) {
      piece_hashes_[f].resize(plan_.files[f].num_chunks());
    }
  }
}

void SaveJob::open_files() {
  io::Engine& engine = res_.host->engine();
  // The ranks of a distributed save share the directory: whoever comes first creates it.
  const int rc = engine.mkdir(paths_.temporary);
  if (rc < 0 && !(coordinator_ && rc == -EEXIST)) {
    detail::throw_sys_error(rc, "create temporary directory " + paths_.temporary);
  }
  const int flags = O_WRONLY | O_CREAT | O_EXCL | (res_.host->direct() ? O_DIRECT : 0);
  for (size_t f = 0; f < plan_.written_files; ++f) {
    const std::string path = paths_.temporary + "/" + plan_.files[f].name;
    const int fd = engine.open(path, flags, 0644);
    if (fd < 0) {
      for (int open_fd : fds_) engine.close(open_fd);
      fds_.clear();
      if (coordinator_) {
        for (size_t g = 0; g < f; ++g)
          ::unlink((paths_.temporary + "/" + plan_.files[g].name).c_str());
      } else {
        remove_temporary(paths_.temporary);
      }
      detail::throw_sys_error(fd, "create shard " + path);
    }
    fds_.push_back(fd);
  }
  // Incremental: the base files are held open from now on (see pipeline/reuse.h); one that
  // cannot be opened as expected is simply written in full.
  for (size_t f = 0; f < plan_.files.size(); ++f) {
    const plan::PlannedFile& file = plan_.files[f];
    if (file.base_hashes.empty()) continue;
    auto base = std::make_unique<BaseFile>(plan_.base_dir + "/" + file.name, file.size);
    if (base->valid()) base_files_[f] = std::move(base);
  }
}

void SaveJob::prepare_sources() noexcept {
  prepared_ = true;
  try {
    sources_.reserve(plan_.files.size());
    for (const plan::PlannedFile& file : plan_.files) {
      sources_.push_back(stage::prepare_sources(file));
    }
  } catch (...) {
    sources_error_ = std::current_exception();
  }
}

void SaveJob::stage(bool lazy) {
  const Clock::time_point t0 = Clock::now();
  std::exception_ptr stage_error;
  const stage::StagingPool::Staging staging(*res_.pool);  // the pool's own copies wait
  try {
    if (!prepared_) prepare_sources();
    if (sources_error_) std::rethrow_exception(sources_error_);
    const std::vector<stage::Sources>& sources = sources_;
    if (!lazy && res_.pool->count() - res_.pool->in_use() >= plan_.chunks.size()) {
      defer_ticket_ = res_.deferred.begin();
    }
    (lazy ? res_.lazy_arena : res_.arena)->execute([&] {
      tbb::parallel_for(size_t{0}, plan_.chunks.size(), [&](size_t i) {
        if (!failed_) stage_chunk(i, sources);
      });
    });
  } catch (...) {
    stage_error = std::current_exception();
    fail(stage_error);
  }
  sources_.clear();  // the caller's tensors: not held past staging
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stats.stage_s = seconds(Clock::now() - t0);
    state_->stats.buffer_waits = buffer_waits_;
    state_->stats.buffers_reused = buffers_reused_;
  }
  if (!stage_error && failed_) {
    std::lock_guard<std::mutex> lock(error_mu_);
    stage_error = error_;
  }
  if (!stage_error && agent_) stage_error = hand_to_agent();
  state_->mark_staged(stage_error);
  if (!stage_error && !coordinator_) {
    // Most of a manifest of many tensors, rendered while the chunks are written, off the
    // commit (finish waits for this token too).
    ++pending_;
    auto self = shared_from_this();
    boost::asio::post(*res_.blocking, [self] {
      self->render_tensor_records();
      self->release_token();
    });
  }
  res_.deferred.release(defer_ticket_);  // the writes held back, unless a wait released them
  release_token();
}

void SaveJob::stage_chunk(size_t index, const std::vector<stage::Sources>& sources) {
  const plan::ChunkRef ref = plan_.chunks[index];
  const plan::PlannedFile& file = plan_.files[ref.file];
  stage::StagingPool& pool = *res_.pool;
  bool waited = false;
  const int buf = pool.acquire(&waited);
  if (waited) ++buffer_waits_;
  if (pool.used_before(buf)) ++buffers_reused_;
  if (agent_) chunk_bufs_[ref.file][ref.chunk] = buf;
  uint8_t* data = pool.data(buf);
  uint64_t len;
  try {
    len = stage::fill_chunk(file, sources[ref.file], ref.chunk, data);
  } catch (...) {
    pool.release(buf);
    throw;  // tbb rethrows it on the staging thread, which fails the job
  }
  ++pending_;
  if (ref.file >= plan_.written_files) {
    auto self = shared_from_this();
    boost::asio::post(*res_.blocking,
                      [self, ref, buf, len] { self->keep_in_memory(ref, buf, len); });
    return;
  }
  progress_.staged(len);
  if (base_files_[ref.file]) {  // (hash_chunk runs there, on the blocking pool)
    // Hashed off the caller's stall, on the blocking pool, before deciding to write.
    auto self = shared_from_this();
    boost::asio::post(*res_.blocking,
                      [self, ref, buf, len] { self->compare_and_submit(ref, buf, len); });
    return;
  }
  auto self = shared_from_this();
  if (res_.deferred.hold(defer_ticket_,
                         [self, ref, buf, len] { self->submit_held(ref, buf, len); })) {
    return;
  }
  submit(ref, buf, len, std::nullopt);
}

void SaveJob::submit_held(plan::ChunkRef ref, int buf, uint64_t len) noexcept {
  try {
    submit(ref, buf, len, std::nullopt);
  } catch (...) {  // not submitted: the buffer and the token are still this chunk's
    fail(std::current_exception());
    res_.pool->release(buf);
    release_token();
  }
}

void SaveJob::compare_and_submit(plan::ChunkRef ref, int buf, uint64_t len) {
  const uint64_t hash = hash_chunk(ref, res_.pool->data(buf), len);
  const plan::PlannedFile& file = plan_.files[ref.file];
  // Equal to the base manifest's hash, and the base file's bytes proven to hash alike.
  if (hash != file.base_hashes[ref.chunk] || failed_ ||
      !base_files_[ref.file]->holds(file.chunk_begin(ref.chunk), file.chunk_end(ref.chunk), hash)) {
    submit(ref, buf, len, hash);
    return;
  }
  hashes_[ref.file][ref.chunk] = hash;
  skipped_[ref.file][ref.chunk] = 1;
  skipped_bytes_ += len;
  if (!hot_ || !hot_->keep(ref.file, ref.chunk, buf)) res_.pool->release(buf);
  progress_.done(len);
  release_token();
}

void SaveJob::keep_in_memory(plan::ChunkRef ref, int buf, uint64_t len) {
  hashes_[ref.file][ref.chunk] = format::hash64(res_.pool->data(buf), len);
  if (!hot_ || !hot_->keep(ref.file, ref.chunk, buf)) res_.pool->release(buf);
  release_token();
}

// Takes over one pending_ token, which the write's completion gives back.
void SaveJob::submit(plan::ChunkRef ref, int buf, uint64_t len, std::optional<uint64_t> hash) {
  const plan::PlannedFile& file = plan_.files[ref.file];
  uint8_t* data = res_.pool->data(buf);
  uint64_t write_len = len;
  if (res_.host->direct() && len % kBlock != 0) {
    // O_DIRECT writes whole blocks: zero the tail; the file is truncated to size at commit.
    write_len = round_up(len);
    std::memset(data + len, 0, write_len - len);
  }
  const uint64_t offset = file.chunk_begin(ref.chunk);
  int64_t expected = 0;
  first_write_ns_.compare_exchange_strong(expected, now_ns());
  // Unless known already, the chunk is hashed when its write completes, on the engine's
  // thread, while the buffer is still ours: the hash overlaps the I/O instead of lengthening
  // the caller's stall.
  auto self = shared_from_this();
  res_.host->engine().write(
      fds_[ref.file], data, write_len, offset, buf, [self, buf, ref, offset, len, hash](int rc) {
        if (rc == 0) {
          self->hashes_[ref.file][ref.chunk] =
              hash ? *hash : self->hash_chunk(ref, self->res_.pool->data(buf), len);
        }
        // A save the agent holds keeps even a failed write's buffer until the agent is told.
        if (!self->hot_ || (rc != 0 && !self->guarded_) ||
            !self->hot_->keep(ref.file, ref.chunk, buf)) {
          self->res_.pool->release(buf);
        }
        if (rc == 0) self->progress_.done(len);
        self->write_done(ref.file, offset, rc);
      });
}

void SaveJob::write_done(uint32_t file, uint64_t offset, int rc) {
  if (rc < 0) {
    fail(detail::sys_error(rc, "write " + paths_.temporary + "/" + plan_.files[file].name +
                                   " at offset " + std::to_string(offset)));
  }
  last_write_ns_ = now_ns();
  release_token();
}

void SaveJob::fail(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (!error_) error_ = e;
  failed_ = true;
}

void SaveJob::release_token() {
  if (--pending_ != 0) return;
  // Every write has completed and staging is over: commit (or clean up) off the io thread.
  auto self = shared_from_this();
  boost::asio::post(*res_.blocking, [self] { self->finish(); });
}

void SaveJob::finish() {
  const Clock::time_point t0 = Clock::now();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    error = error_;
  }
  uint64_t manifest_bytes = 0;
  std::string leftover;
  io::Engine& engine = res_.host->engine();
  // Step 2 of the protocol (commit.cpp): exact sizes, fsync, close every shard.
  for (size_t f = 0; f < fds_.size(); ++f) {
    const std::string path = paths_.temporary + "/" + plan_.files[f].name;
    int rc = 0;
    if (!error && res_.host->direct() && plan_.files[f].size % kBlock != 0) {
      rc = engine.ftruncate(fds_[f], plan_.files[f].size);
      if (rc < 0) error = detail::sys_error(rc, "truncate " + path);
    }
    if (!error) {
      rc = engine.fsync(fds_[f]);
      if (rc < 0) error = detail::sys_error(rc, "fsync " + path);
    }
    rc = engine.close(fds_[f]);
    if (rc < 0 && !error) error = detail::sys_error(rc, "close " + path);
  }
  fds_.clear();
  if (!error) {
    try {
      reuse_base_files();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (!error) error = compare();
  base_files_.clear();  // closes the base files
  if (coordinator_) {
    error = coordinate(error, &manifest_bytes, &leftover);
  } else if (!error) {
    try {
      std::string text = tensor_text_ready_
                             ? format::readable_manifest_text(
                                   manifest(/*memory=*/false, /*tensors=*/false), &tensor_text_)
                             : format::readable_manifest_text(manifest());
      manifest_bytes = commit_directory(engine, paths_, text, overwrite_, &leftover);
      hot_commit([&] { return format::parse_manifest(text, paths_.final); });
      if (guarded_) committed_text_ = std::move(text);
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error && !keep_temporary_) remove_temporary(paths_.temporary);
  // Before the buffers can go back: the agent lets go of them.
  if (guarded_) agent_->done(agent_seq_, error ? nullptr : &committed_text_);
  hot_.reset();  // a failed save's kept buffers go back to the pool now
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    SaveStats& s = state_->stats;
    s.commit_s = seconds(Clock::now() - t0);
    s.coordinate_s = coordinate_s_;
    s.write_s = last_write_ns_ > first_write_ns_ ? (last_write_ns_ - first_write_ns_) / 1e9 : 0;
    s.total_s = seconds(Clock::now() - started_);
    s.bytes = plan_.total_bytes + manifest_bytes;
    s.linked_bytes = linked_bytes_;
    s.written_bytes = s.bytes - linked_bytes_;
    s.reused_bytes = skipped_bytes_;
    s.leftover = std::move(leftover);
    s.unchanged_since = comparison_.since;
    s.unchanged_tensors = unchanged_.size();
    s.stale = stale_;
  }
  // Whatever a next save could need (the in-flight slot; the staging buffers went back as their
  // writes completed) is released before the handle completes: once wait() returns or an
  // on_complete callback runs, a new save is admitted at once.
  // The caller's tensors are no longer needed: their references go before the handle
  // completes, so that the caller may free them once wait() returns (no reference dropped by a
  // tsnap thread afterwards).
  plan::clear_sources(plan_);
  if (release_slot_) {
    Learned next = error ? Learned() : std::move(learned_);
    if (!plan_.incremental && !plan_.entries.empty() && plan_.written_files == plan_.files.size()) {
      next.plan = std::move(plan_);  // the job's last use of it
    }
    release_slot_(!error, std::move(next));
  }
  state_->complete(error);
  if (on_completed_) on_completed_();
}

uint64_t SaveJob::hash_chunk(plan::ChunkRef ref, const uint8_t* data, uint64_t len) {
  const plan::PlannedFile& file = plan_.files[ref.file];
  const uint64_t begin = file.chunk_begin(ref.chunk), end = file.chunk_end(ref.chunk);
  thread_local std::vector<std::pair<uint64_t, uint64_t>> pieces;
  pieces.clear();
  for (const plan::PlannedTensor& t : file.tensors) {  // in file order
    const uint64_t lo = std::max(t.begin, begin), hi = std::min(t.end, end);
    if (lo < hi) pieces.emplace_back(lo - begin, hi - begin);
  }
  return format::hash64_with_pieces(data, len, pieces, &piece_hashes_[ref.file][ref.chunk]);
}

std::exception_ptr SaveJob::compare() {
  learned_ = learned();
  const Comparison& c = comparison_;
  if (!c.signatures || c.since.empty()) return nullptr;
  for (const auto& [key, signature] : learned_.signatures) {
    const auto it = c.signatures->find(key);
    if (!signature.empty() && it != c.signatures->end() && it->second == signature) {
      unchanged_.push_back(key);  // sorted: the map is
    }
  }
  const bool advanced = c.step && c.since_step && *c.step > *c.since_step;
  if (!advanced || c.stale.must_change.empty()) return nullptr;
  for (const std::string& key : unchanged_) {
    for (const std::string& pattern : c.stale.must_change) {
      if (detail::glob_match(pattern, key)) {
        stale_.push_back(key);
        break;
      }
    }
  }
  if (stale_.empty() || !c.stale.fail) return nullptr;
  std::string some;
  for (size_t i = 0; i < stale_.size() && i < 3; ++i) {
    some += (i ? ", " : "") + format::printable(stale_[i]);
  }
  return make_error(
      ErrorCode::kStale,
      "snapshot " + std::filesystem::path(paths_.final).filename().string() + " (step " +
          std::to_string(*c.step) + ") would be stale: " + std::to_string(stale_.size()) +
          (stale_.size() == 1 ? " tensor" : " tensors") +
          " that training changes at every step hold the same bytes as in " + c.since + " (step " +
          std::to_string(*c.since_step) + "): " + some + (stale_.size() > 3 ? ", ..." : "") +
          "; nothing was committed (is the optimizer's state saved from a copy that no "
          "longer updates?)");
}

SaveJob::Learned SaveJob::learned() const {
  Learned out;
  for (size_t f = 0; f < plan_.written_files; ++f) {
    const plan::PlannedFile& file = plan_.files[f];
    std::vector<size_t> next(file.num_chunks(), 0);  // next piece of each chunk
    for (const plan::PlannedTensor& t : file.tensors) {
      if (file.stable && !base_files_[f]) out.carried.insert(t.name);
      std::vector<uint64_t>& sig = out.signatures[t.name];
      for (uint64_t c = t.begin / file.chunk_bytes;
           t.end > t.begin && c <= (t.end - 1) / file.chunk_bytes; ++c) {
        const std::vector<uint64_t>& pieces = piece_hashes_[f][c];
        sig.push_back(std::max(t.begin, file.chunk_begin(c)) - t.begin);
        sig.push_back(next[c] < pieces.size() ? pieces[next[c]++] : 0);
      }
    }
  }
  return out;
}

void SaveJob::reuse_base_files() {
  for (size_t f = 0; f < plan_.files.size(); ++f) {
    if (!base_files_[f]) continue;
    const plan::PlannedFile& file = plan_.files[f];
    const std::string path = paths_.temporary + "/" + file.name;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    std::vector<BaseFile::Chunk> reused;
    for (uint64_t c = 0; c < file.num_chunks(); ++c) {
      if (!skipped_[f][c]) continue;
      reused.push_back({file.chunk_begin(c), file.chunk_end(c), hashes_[f][c]});
      if (!ranges.empty() && ranges.back().second == file.chunk_begin(c)) {
        ranges.back().second = file.chunk_end(c);
      } else {
        ranges.emplace_back(file.chunk_begin(c), file.chunk_end(c));
      }
    }
    if (ranges.empty()) continue;
    if (ranges.size() == 1 && ranges[0] == std::make_pair(uint64_t{0}, file.size)) {
      // Nothing of it was written: the empty file makes way for the base file.
      if (::unlink(path.c_str()) != 0) detail::throw_sys_error(-errno, "remove " + path);
      reused_whole_[f] = true;
      if (base_files_[f]->link_or_copy(path)) {
        linked_bytes_ += file.size;
        // A linked file is the base's own inode: unwritten since it was opened (before its
        // chunks were proven), it holds what was proven, and reading it back would cost as
        // much as writing it.
        if (base_files_[f]->unmodified_since_opened()) continue;
      }
    } else {
      base_files_[f]->copy_ranges(path, ranges);
    }
    base_files_[f]->check_reused(path, reused);
  }
}

// The image is installed before the handle completes. Alone, it gets the manifest as a reader
// of the directory would; in a group, this rank's view (its files, its memory-only files, the
// user's metadata), which holds every entry it restores.
void SaveJob::hot_commit(const std::function<Manifest()>& manifest) noexcept {
  if (!hot_) return;
  try {
    hot_->commit(manifest());
  } catch (...) {
  }
}

void SaveJob::render_tensor_records() noexcept {
  try {
    Manifest m;
    add_tensor_records(m, plan_.written_files);
    tensor_text_ = format::manifest_tensor_text(m);
    format::scan_bounds(tensor_text_);  // the commit checks only the rest
    tensor_text_ready_ = true;
  } catch (...) {
    // Rendered again at the commit, which reports the error.
  }
}

void SaveJob::add_tensor_records(Manifest& m, size_t files) const {
  for (size_t f = 0; f < files; ++f) {
    const plan::PlannedFile& file = plan_.files[f];
    for (const plan::PlannedTensor& t : file.tensors) {
      m.tensors.push_back(
          {t.name, file.name, t.dtype, t.source_dtype, t.shape, t.begin, t.end, t.shard});
    }
  }
}

void SaveJob::guard_with(std::shared_ptr<AgentClient> agent) {
  agent_ = std::move(agent);
  agent_seq_ = agent_->next_seq();
  chunk_bufs_.resize(plan_.files.size());
  for (size_t f = 0; f < plan_.files.size(); ++f) {
    chunk_bufs_[f].assign(plan_.files[f].num_chunks(), -1);
  }
}

std::exception_ptr SaveJob::hand_to_agent() noexcept {
  const std::string name = std::filesystem::path(paths_.final).filename().string();
  try {
    if (!hot_ || !hot_->whole()) {  // never abandoned with an agent (keep_building)
      throw_error(ErrorCode::kInternal, "the staged image of save " + name + " is not whole");
    }
    nlohmann::json bufs = nlohmann::json::object();
    for (size_t f = 0; f < plan_.written_files; ++f) bufs[plan_.files[f].name] = chunk_bufs_[f];
    agent_->guard(agent_seq_, name,
                  format::manifest_to_text(manifest(false, true, /*hashes=*/false)), bufs,
                  overwrite_);
    guarded_ = true;
    return nullptr;
  } catch (...) {
    std::exception_ptr e = std::current_exception();
    if (agent_->fall_back()) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          std::cerr << "tsnap: saving without the snapshot agent at " << agent_->socket()
                    << " (agent.fall_back): " << x.what() << std::endl;
        }
      });
      return nullptr;
    }
    fail(e);
    return e;
  }
}

Manifest SaveJob::manifest(bool memory, bool tensors, bool hashes) const {
  Manifest m;
  m.id = plan_.id;
  m.tsnap_version = TSNAP_VERSION_STRING;
  m.torch_version = TORCH_VERSION;
  const auto now = std::chrono::system_clock::now();
  m.created = format::utc_timestamp(now);
  m.created_unix_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  m.world_size = coordinator_ ? coordinator_->world_size() : 1;
  const int rank = coordinator_ ? coordinator_->rank() : 0;
  m.metadata = metadata_;
  m.step = comparison_.step;
  m.unchanged_since = comparison_.since;
  m.unchanged = unchanged_;
  const size_t files = memory ? plan_.files.size() : plan_.written_files;
  for (size_t f = 0; f < files; ++f) {
    const plan::PlannedFile& file = plan_.files[f];
    m.files.push_back({file.name, file.size, file.data_offset, file.chunk_bytes,
                       hashes ? hashes_[f] : std::vector<uint64_t>(file.num_chunks(), 0), rank,
                       file.header_id == plan_.id ? std::string() : file.header_id,
                       reused_whole_[f] ? plan_.base_name : std::string()});
  }
  if (tensors) add_tensor_records(m, files);
  std::sort(m.tensors.begin(), m.tensors.end(),
            [](const TensorRecord& a, const TensorRecord& b) { return a.name < b.name; });
  return m;
}

std::exception_ptr SaveJob::coordinate(std::exception_ptr error, uint64_t* manifest_bytes,
                                       std::string* leftover) {
  dist::Coordinator& c = *coordinator_;
  const std::string& id = plan_.id;
  try {
    // Every rank reports: its manifest part (no user metadata: rank 0's goes in the snapshot)
    // or its error, and what it believes is replicated, to be compared by rank 0.
    nlohmann::json report = {{"name", std::filesystem::path(paths_.final).filename().string()},
                             {"replicated", plan_.replicated}};
    if (error) {
      report["error"] = error_json(error);
    } else {
      Manifest part = manifest();
      part.metadata = nlohmann::json::object();
      report["manifest"] = format::manifest_to_text(part);
    }
    if (c.rank() != 0) {
      c.publish(id, report.dump());
      if (error) {  // rank 0 cannot commit without this part: no need to wait
        try {
          c.acknowledge(id);
        } catch (const Error&) {
        }
        return error;
      }
      std::string outcome;
      const Clock::time_point w0 = Clock::now();
      try {
        outcome = c.outcome(id);
        coordinate_s_ = seconds(Clock::now() - w0);
      } catch (...) {
        // Rank 0 is silent: it may yet commit, so this rank's files stay (a later writer
        // removes them if it never does).
        keep_temporary_ = true;
        throw;
      }
      try {
        c.acknowledge(id);
      } catch (const Error&) {
        // Rank 0 then waits for this rank until its timeout; the outcome stands.
      }
      if (!outcome.empty()) {
        const nlohmann::json verdict = nlohmann::json::parse(outcome);
        if (!verdict.contains("manifest")) return error_from_json(verdict);
        // Node-local roots: rank 0 committed its node's copy; this node's comes next.
        try {
          *manifest_bytes =
              commit_node_copy(res_.host->engine(), paths_,
                               verdict.at("manifest").get<std::string>(), id, overwrite_, leftover);
        } catch (...) {
          keep_temporary_ = true;  // another rank of this node may still commit it
          throw;
        }
      }
      hot_commit([&] { return manifest(true); });
      return nullptr;
    }
    if (error) {
      // Decide at once: the other ranks need not wait for their timeout.
      c.decide(id, peer_failed(error_json(error), 0).dump());
      return error;
    }
    c.publish(id, report.dump());
    bool everyone_reported = false;
    std::string committed;  // the verdict of a commit: "" (one shared directory) or the manifest
    try {
      const Clock::time_point w0 = Clock::now();
      std::vector<std::string> reports = c.gather(id);
      everyone_reported = true;
      coordinate_s_ = seconds(Clock::now() - w0);
      std::string text = merge_parts(reports, metadata_);
      *manifest_bytes = commit_directory(res_.host->engine(), paths_, text, overwrite_, leftover);
      // Node-local roots: every other node commits its own copy with the same manifest.
      if (res_.options.tier.node_local) committed = nlohmann::json{{"manifest", text}}.dump();
    } catch (...) {
      error = std::current_exception();
    }
    c.decide(id, error ? error_json(error).dump() : committed);
    if (!error) hot_commit([&] { return manifest(true); });
    // Rank 0 may host the store: the others must read the verdict before it can end.
    const int readers = everyone_reported ? c.world_size() - 1 : c.reported_others(id);
    if (readers > 0) c.await_acknowledgements(id, readers);
    return error;
  } catch (...) {
    return error ? error : std::current_exception();
  }
}

}  // namespace tsnap::pipeline
