/// \file
/// The drain of a two-tier Snapshotter; the protocol and its passes are in drain.h. The copy
/// of one snapshot, step by step:
///   1. `SnapshotDir::open(<local>/<name>)`, then MANIFEST.json read through that descriptor
///      and parsed (the bytes are kept: the durable manifest is the same text);
///   2. `<durable>/<name>` holds the same id: known durable, nothing to copy; a different,
///      newer save (format.md's age rule): superseded, nothing to copy;
///   3. mkdir `<durable>/.<name>.tmp-<new id>`; for each file of the manifest, in manifest
///      order: open it relative to the local directory (gone and the local name replaced or
///      removed meanwhile: abandon, the newer save is drained by its own pass), check its size,
///      create the durable file (O_EXCL), then chunk by chunk: read the whole chunk, hash it,
///      compare with the manifest (FormatError kHashMismatch naming file, chunk and byte range
///      on a mismatch, before anything of that chunk is written), write it in pieces of 1 MiB
///      paced to the rate; fsync and close the durable file;
///   4. commit_directory (commit.cpp steps 3-7) with overwrite, so a durable snapshot of that
///      name is replaced in one atomic exchange.
/// Any throw before step 4's rename removes the temporary directory.

#include "pipeline/drain.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <system_error>
#include <vector>

#include "common/run_parallel.h"
#include "common/sys_error.h"
#include "common/thread_name.h"
#include "format/hash.h"
#include "format/layout.h"
#include "format/manifest_io.h"
#include "format/open_file.h"
#include "io/fd.h"
#include "io/thread_priority.h"
#include "pipeline/commit.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"
#include "tsnap/remove.h"

namespace tsnap::pipeline {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kPieceBytes = 1ull << 20;  // pacing and write granularity

format::SnapshotAge age_of(const Manifest& m) {
  return {format::step_of(m.metadata), m.created_unix_ns};
}

// Closes a durable file through the engine on every path.
class EngineFd {
 public:
  EngineFd(io::Engine& engine, int fd) : engine_(engine), fd_(fd) {}
  ~EngineFd() {
    if (fd_ >= 0) (void)engine_.close(fd_);
  }
  EngineFd(const EngineFd&) = delete;
  EngineFd& operator=(const EngineFd&) = delete;
  int get() const { return fd_; }
  int close() { return engine_.close(std::exchange(fd_, -1)); }

 private:
  io::Engine& engine_;
  int fd_;
};

void check(int rc, const std::string& what) {
  if (rc < 0) detail::throw_sys_error(rc, what);
}

}  // namespace

Drain::Drain(DrainConfig config) : config_(std::move(config)) {
  engine_ = config_.engine ? config_.engine : io::make_pwrite_engine(1, config_.background);
  if (format::is_s3(config_.durable_root)) {
    // The store is first asked on the drain thread (open_store): a store that is down or
    // refuses the credentials fails drains, never the Snapshotter.
    s3_.emplace(config_.durable_root.native());
    requested_ = 1;
    thread_ = std::thread([this] {
      detail::name_this_thread("tsnap-drain");  // its upload threads inherit the name
      run();
    });
    return;
  }
  std::error_code ec;
  fs::create_directories(config_.durable_root, ec);
  if (ec) {
    throw_error(ErrorCode::kIo,
                "cannot create durable root " + config_.durable_root.string() + ": " + ec.message(),
                ec.value());
  }
  lock_.emplace(config_.durable_root);  // removes stale temporaries when no other writer is alive
  for (const Listed& l : list(config_.durable_root)) {
    if (l.committed) durable_.emplace(l.name, l.manifest->id);
  }
  requested_ = 1;  // the first pass: whatever the local tier holds that the durable one lacks
  thread_ = std::thread([this] {
    detail::name_this_thread("tsnap-drain");  // its upload threads inherit the name
    run();
  });
}

Drain::~Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Drain::request() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++requested_;
  }
  cv_.notify_all();
}

void Drain::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t want = ++requested_;
  cv_.notify_all();
  cv_.wait(lock, [&] { return finished_ >= want || stop_; });
  if (unreported_.empty()) return;
  // The oldest failure whose snapshot has not drained since.
  auto first = std::min_element(failure_order_.begin(), failure_order_.end(),
                                [](const auto& a, const auto& b) { return a.second < b.second; });
  std::exception_ptr e = unreported_.at(first->first);
  unreported_.erase(first->first);
  failure_order_.erase(first);
  std::rethrow_exception(e);
}

bool Drain::drained(const std::string& name) const {
  std::optional<Manifest> m;
  try {
    m = read_manifest(config_.local_root / name);
  } catch (const Error&) {
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (m) return durable_.count({name, m->id}) != 0;
  // No local copy (local_keep_last removed it once drained, or it never was): drained when a
  // save of that name reached the durable tier.
  const auto it = durable_.lower_bound({name, std::string()});
  return it != durable_.end() && it->first == name;
}

DrainStats Drain::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int Drain::add_listener(std::function<void(const DrainRecord&)> fn) {
  std::lock_guard<std::mutex> lock(listeners_mu_);
  listeners_.emplace(next_listener_, std::move(fn));
  return next_listener_++;
}

void Drain::remove_listener(int id) {
  std::lock_guard<std::mutex> lock(listeners_mu_);
  listeners_.erase(id);
}

void Drain::notify(const DrainRecord& record) {
  std::lock_guard<std::mutex> lock(listeners_mu_);
  for (auto& [id, fn] : listeners_) {
    try {
      fn(record);
    } catch (...) {
      // A listener's failure must not stop the drain.
    }
  }
}

void Drain::run() {
  if (config_.background) io::make_background_thread();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || requested_ > finished_; });
    if (stop_) break;
    const uint64_t serving = requested_;
    lock.unlock();
    try {
      pass();
    } catch (const Cancelled&) {
    } catch (...) {
      // Listing the local root failed: reported like a failed drain.
      const std::exception_ptr e = std::current_exception();
      std::lock_guard<std::mutex> relock(mu_);
      ++stats_.failed;
      stats_.last_error = detail::message_of(e);
      unreported_[""] = e;
      failure_order_[""] = ++failures_;
    }
    lock.lock();
    finished_ = serving;
    cv_.notify_all();
  }
  finished_ = requested_;  // wake waiters: nothing more will run
  cv_.notify_all();
}

void Drain::open_store() {
  std::set<Save> durable;
  for (const Listed& l : s3_->list()) {
    if (l.committed) durable.emplace(l.name, l.manifest->id);
  }
  // Uploads a killed drain left: the newest of each key is resumed, the others aborted.
  std::map<std::string, io::S3Upload> newest;
  const io::S3Url& at = s3_->location();
  for (const io::S3Upload& u :
       s3_->client().list_multipart_uploads(at.bucket, at.prefix.empty() ? "" : at.prefix + "/")) {
    auto [it, fresh] = newest.emplace(u.key, u);
    // Node-local roots: another rank may be resuming the older one; the store's lifecycle rule
    // for incomplete uploads takes what no drain completes.
    if (fresh || config_.node_rank >= 0) continue;
    const io::S3Upload stale =
        u.initiated > it->second.initiated ? std::exchange(it->second, u) : u;
    try {
      s3_->client().abort_multipart_upload(at.bucket, stale.key, stale.upload_id);
    } catch (const Error&) {
      // gone already; a lifecycle rule of the store removes what stays
    }
  }
  for (const auto& [key, u] : newest) resumable_.emplace(key, u.upload_id);
  std::lock_guard<std::mutex> lock(mu_);
  durable_.insert(durable.begin(), durable.end());
  store_open_ = true;
}

void Drain::pass() {
  if (s3_ && !store_open_) open_store();
  std::vector<Listed> local = list(config_.local_root);  // oldest first
  for (const Listed& l : local) {
    if (stop_) throw Cancelled{};
    if (!l.committed) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const Save save{l.name, l.manifest->id};
      if (durable_.count(save) || failed_.count(save)) continue;
    }
    std::optional<DrainRecord> record;
    std::exception_ptr error;
    const auto started = Clock::now();
    try {
      record = drain_one(l.path, l.name);
    } catch (const Cancelled&) {
      throw;
    } catch (const Abandoned&) {
      continue;
    } catch (...) {
      error = std::current_exception();
    }
    if (!error && !record) continue;  // nothing to copy
    if (error) {
      DrainRecord failed;
      failed.name = l.name;
      failed.id = l.manifest->id;
      failed.error = detail::message_of(error);
      failed.seconds = std::chrono::duration<double>(Clock::now() - started).count();
      // Not retried: local bytes that are bad, or a save another writer published first
      // under the same name (retrying would replace theirs).
      bool final = false;
      try {
        std::rethrow_exception(error);
      } catch (const FormatError&) {
        final = true;
      } catch (const Error& e) {
        final = e.code() == ErrorCode::kAlreadyExists;
      } catch (...) {
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.failed;
        stats_.last_error = failed.error;
        unreported_[l.name] = error;
        failure_order_[l.name] = ++failures_;
        if (final) failed_.emplace(l.name, l.manifest->id);
      }
      notify(failed);
      if (!final) return;  // the durable side failed: the next pass retries
      continue;
    }
    keep_last(*record);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.drained;
      stats_.bytes += record->bytes;
      stats_.seconds += record->seconds;
      unreported_.erase(record->name);
      failure_order_.erase(record->name);
    }
    notify(*record);
  }
  // Node-local roots: a save this rank did not publish is learned durable by a later pass.
  if (config_.node_rank >= 0) {
    DrainRecord removals;
    keep_last(removals);
  }
  // Forget saves that are gone from both tiers' concern (no longer local), so the set stays
  // the size of the roots.
  std::set<Save> present;
  for (const Listed& l : list(config_.local_root)) {
    if (l.committed) present.emplace(l.name, l.manifest->id);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = failed_.begin(); it != failed_.end();) {
    it = present.count(*it) ? std::next(it) : failed_.erase(it);
  }
}

// An incremental save's file reused whole from snapshot X (FileRecord::reused_from) is the
// same bytes as X's file of that name; when the durable tier holds X with that file (same size,
// header id and chunk hashes), a hard link there replaces the copy, so incremental snapshots
// stay incremental in the durable tier too. Anything else (no X there, a different save of X,
// links refused) copies.
bool Drain::link_reused(const FileRecord& f, const Manifest& m, const std::string& temporary,
                        std::map<std::string, std::optional<Manifest>>& bases) const {
  if (f.reused_from.empty()) return false;
  try {
    format::check_snapshot_name(f.reused_from);  // a plain name under the durable root
  } catch (const Error&) {
    return false;
  }
  auto it = bases.find(f.reused_from);
  if (it == bases.end()) {
    std::optional<Manifest> base;
    try {
      base = read_manifest(config_.durable_root / f.reused_from);
    } catch (const Error&) {
    }
    it = bases.emplace(f.reused_from, std::move(base)).first;
  }
  if (!it->second) return false;
  const Manifest& base = *it->second;
  const FileRecord* there = base.find_file(f.name);
  if (there == nullptr || there->size != f.size || there->chunk_bytes != f.chunk_bytes ||
      there->chunk_hashes != f.chunk_hashes || there->header_id(base.id) != f.header_id(m.id)) {
    return false;
  }
  const fs::path from = config_.durable_root / f.reused_from / f.name;
  return ::link(from.c_str(), (temporary + "/" + f.name).c_str()) == 0;
}

std::optional<DrainRecord> Drain::drain_one(const fs::path& local, const std::string& name) {
  const auto started = Clock::now();
  // 1. The local snapshot, opened once.
  std::optional<format::SnapshotDir> dir;
  std::string text;
  Manifest m;
  try {
    dir.emplace(format::SnapshotDir::open(local));
    text = format::manifest_text_in(*dir);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound) throw Abandoned{};  // removed since the listing
    throw;
  }
  m = format::parse_manifest(text, dir->label(kManifestName));

  if (config_.node_rank >= 0) {
    return s3_ ? drain_share_s3(*dir, text, m, name) : drain_share_dir(*dir, text, m, name);
  }
  if (s3_) return drain_one_s3(*dir, text, m, name);

  // 2. Durable already, or superseded there.
  if (settled_dir(name, m)) return std::nullopt;

  // 3. Copy into a temporary directory of the durable root.
  const std::string root = config_.durable_root.string();
  CommitPaths paths{root, root + "/" + format::temporary_name(name, format::new_save_id()),
                    (config_.durable_root / name).string()};
  check(engine_->mkdir(paths.temporary), "create directory " + paths.temporary);
  DrainRecord record;
  record.name = name;
  record.id = m.id;
  try {
    std::map<std::string, std::optional<Manifest>> durable_bases;  // by snapshot name
    for (const FileRecord& f : m.files) {
      if (link_reused(f, m, paths.temporary, durable_bases)) {
        record.linked_bytes += f.size;
        continue;
      }
      const format::OpenedFile src = open_source(*dir, f);
      copy_file(src, dir->label(f.name), f, paths.temporary + "/" + f.name, record);
    }
    // 4. The commit protocol of every save.
    std::string leftover;
    record.bytes += commit_directory(*engine_, paths, text, /*overwrite=*/true, &leftover);
  } catch (...) {
    remove_temporary(paths.temporary);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    durable_.emplace(name, m.id);
  }
  record.ok = true;
  record.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return record;
}

bool Drain::settled_dir(const std::string& name, const Manifest& m) {
  std::error_code ec;
  const fs::path final_path = config_.durable_root / name;
  if (!fs::exists(final_path, ec)) return false;
  try {
    const Manifest there = read_manifest(final_path);
    if (there.id == m.id || format::newer(age_of(there), age_of(m))) {
      std::lock_guard<std::mutex> lock(mu_);
      durable_.emplace(name, m.id);
      return true;
    }
  } catch (const Error&) {
    // Not a valid snapshot there: the commit replaces it.
  }
  return false;
}

format::OpenedFile Drain::open_source(const format::SnapshotDir& dir, const FileRecord& f) const {
  try {
    return format::open_snapshot_file(dir, f.name, "shard");
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound && dir.replaced()) throw Abandoned{};
    throw;
  }
}

void Drain::copy_file(const format::OpenedFile& src, const std::string& label, const FileRecord& f,
                      const std::string& to, DrainRecord& record) {
  const std::string root = config_.durable_root.string();
  if (src.size() != f.size) {
    throw_error(src.size() < f.size ? ErrorCode::kTruncated : ErrorCode::kBadManifest,
                "drain: " + label + " is " + std::to_string(src.size()) +
                    " bytes, the manifest says " + std::to_string(f.size) + "; not copied to " +
                    root);
  }
  const int fd = engine_->open(to, O_WRONLY | O_CREAT | O_EXCL, 0644);
  check(fd, "create " + to);
  EngineFd dst(*engine_, fd);
  std::vector<char> buffer(std::max<size_t>(f.chunk_bytes, 1));
  for (size_t i = 0; i < f.chunk_hashes.size(); ++i) {
    const uint64_t offset = i * f.chunk_bytes;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(f.chunk_bytes, f.size - offset));
    const int64_t n = io::read_full(src.fd.get(), buffer.data(), len, offset);
    if (n < 0) detail::throw_sys_error(static_cast<int>(n), "read " + label);
    if (static_cast<size_t>(n) != len) {
      throw_error(ErrorCode::kTruncated, "drain: " + label + " ended at byte " +
                                             std::to_string(offset + n) + " inside chunk " +
                                             std::to_string(i) + "; not copied to " + root);
    }
    const uint64_t hash = format::hash64(buffer.data(), len);
    if (hash != f.chunk_hashes[i]) {
      throw_error(ErrorCode::kHashMismatch, "drain: chunk " + std::to_string(i) + " of " + label +
                                                " (bytes [" + std::to_string(offset) + ", " +
                                                std::to_string(offset + len) + ")) has XXH3-64 " +
                                                format::hash_hex(hash) + ", the manifest says " +
                                                format::hash_hex(f.chunk_hashes[i]) +
                                                "; the snapshot is not copied to " + root);
    }
    for (size_t p = 0; p < len; p += kPieceBytes) {
      const size_t piece = static_cast<size_t>(std::min<uint64_t>(kPieceBytes, len - p));
      pace(piece);
      check(io::write_and_wait(*engine_, dst.get(), buffer.data() + p, piece, offset + p),
            "write " + to);
    }
  }
  check(engine_->fsync(dst.get()), "fsync " + to);
  check(dst.close(), "close " + to);
  ::posix_fadvise(src.fd.get(), 0, 0, POSIX_FADV_DONTNEED);  // a copy, not a reader's data
  record.bytes += f.size;
}

std::optional<DrainRecord> Drain::drain_one_s3(const format::SnapshotDir& dir,
                                               const std::string& text, const Manifest& m,
                                               const std::string& name) {
  const auto started = Clock::now();
  // 2. Durable already, or superseded there; an older save of the name stops being listed
  // before any of its objects changes.
  if (settled_s3(name, m)) return std::nullopt;
  // 3. The shards.
  DrainRecord record;
  record.name = name;
  record.id = m.id;
  for (const FileRecord& f : m.files) {
    upload_file(open_source(dir, f), dir.label(f.name), f, s3_->key(name, f.name), record);
  }
  // 4. The manifest last.
  publish_s3(name, text, m, record);
  record.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return record;
}

bool Drain::settled_s3(const std::string& name, const Manifest& m) {
  const format::S3Root& store = *s3_;
  try {
    const std::optional<std::string> there_text = store.manifest_text(name);
    if (!there_text) return false;
    const Manifest there = format::parse_manifest(*there_text, store.url(name));
    if (there.id == m.id || format::newer(age_of(there), age_of(m))) {
      std::lock_guard<std::mutex> lock(mu_);
      durable_.emplace(name, m.id);
      return true;
    }
  } catch (const FormatError&) {
    // Not a valid snapshot there: replaced below.
  }
  store.client().delete_object(store.location().bucket, store.key(name, kManifestName));
  return false;
}

void Drain::publish_s3(const std::string& name, const std::string& text, const Manifest& m,
                       DrainRecord& record) {
  // From now on the snapshot is listed; then the older save's leftovers go. Published only
  // where no manifest is (If-None-Match), so that of two writers that drain the same name at
  // once the second learns of the first instead of replacing it.
  const format::S3Root& store = *s3_;
  const std::string& bucket = store.location().bucket;
  pace(text.size());
  try {
    store.client().put_object(bucket, store.key(name, kManifestName), text.data(), text.size(),
                              /*if_absent=*/true);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kAlreadyExists) throw;
    // A retry of this PUT whose first answer was lost (or, on node-local roots, another rank
    // that completed the same save at once) finds the same manifest.
    if (store.manifest_text(name) != std::optional<std::string>(text)) {
      throw_error(ErrorCode::kAlreadyExists,
                  "drain: another writer published snapshot " + store.url(name) +
                      " while this one uploaded save " + m.id +
                      " of that name; this save is not in the store (the two wrote the same "
                      "objects: check the published one with `tsnap verify " +
                      store.url(name) + "`)");
    }
  }
  record.bytes += text.size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    durable_.emplace(name, m.id);
  }
  std::vector<std::string> files;
  for (const FileRecord& f : m.files) files.push_back(f.name);
  try {
    store.remove_other_objects(name, files);
  } catch (const Error&) {
    // Leftovers cost space only; the next replacement or removal of the name deletes them.
  }
  record.ok = true;
}

void Drain::copy_share(const format::SnapshotDir& dir, const Manifest& m,
                       const std::set<std::string>& in_place,
                       const std::function<bool(const FileRecord&)>& missing,
                       const std::function<void(const FileRecord&, const format::OpenedFile&,
                                                const std::string&)>& copy) {
  // This rank's own files first, then the rest of the node's (those of ranks that are gone)
  // starting at a place of its own, so that the node's ranks start apart.
  const size_t n = m.files.size();
  std::vector<const FileRecord*> order;
  for (int own = 1; own >= 0; --own) {
    for (size_t k = 0; k < n; ++k) {
      const FileRecord& f = m.files[(k + static_cast<size_t>(config_.node_rank)) % n];
      if ((f.rank == config_.node_rank) == (own == 1)) order.push_back(&f);
    }
  }
  for (const FileRecord* f : order) {
    if (stop_) throw Cancelled{};
    if (in_place.count(f->name)) continue;
    format::OpenedFile src;
    try {
      src = open_source(dir, *f);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kNotFound) continue;  // another node's file
      throw;
    }
    // Held until the copy is in place: the node's other ranks skip the file meanwhile.
    const io::FileLock claim(src.fd.get(), /*try_only=*/true);
    if (claim.error() == EWOULDBLOCK) continue;
    if (!claim.locked()) detail::throw_sys_error(-claim.error(), "lock " + dir.label(f->name));
    if (missing(*f)) copy(*f, src, dir.label(f->name));
  }
}

std::optional<DrainRecord> Drain::drain_share_s3(const format::SnapshotDir& dir,
                                                 const std::string& text, const Manifest& m,
                                                 const std::string& name) {
  const auto started = Clock::now();
  if (settled_s3(name, m)) return std::nullopt;
  const format::S3Root& store = *s3_;
  const std::string& bucket = store.location().bucket;
  io::S3Client& client = store.client();
  // A file of this save is in the store once its mark is: an empty object written after the
  // file's upload completed (every chunk checked). The marks go with the older objects once
  // the manifest is published.
  const std::string marks = store.key(name, kUploadedPrefix + m.id) + "/";
  auto uploaded = [&] {
    std::set<std::string> names;
    for (const io::S3Object& o : client.list(bucket, marks).objects) {
      names.insert(o.key.substr(marks.size()));
    }
    return names;
  };
  DrainRecord record;
  record.name = name;
  record.id = m.id;
  copy_share(
      dir, m, uploaded(),
      [&](const FileRecord& f) { return !client.head_object(bucket, marks + f.name); },
      [&](const FileRecord& f, const format::OpenedFile& src, const std::string& label) {
        upload_file(src, label, f, store.key(name, f.name), record);
        client.put_object(bucket, marks + f.name, "", 0);
      });
  const std::set<std::string> done = uploaded();
  const bool complete = std::all_of(m.files.begin(), m.files.end(),
                                    [&](const FileRecord& f) { return done.count(f.name) != 0; });
  if (!complete) return share_done(record);  // a rank still uploading publishes it
  publish_s3(name, text, m, record);
  record.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return record;
}

std::optional<DrainRecord> Drain::drain_share_dir(const format::SnapshotDir& dir,
                                                  const std::string& text, const Manifest& m,
                                                  const std::string& name) {
  const auto started = Clock::now();
  // Every rank copies into the same temporary directory (named by the save id): a file is in
  // place once renamed to its name there, from a part file of the rank that copied it. It is
  // not one that a writer starting alone removes as stale (format::is_temporary): its files may
  // be those of ranks that are gone, for a later drain to complete the save with.
  const std::string root = config_.durable_root.string();
  const CommitPaths paths{root, root + "/" + format::temporary_name(name, m.id) + kShareSuffix,
                          (config_.durable_root / name).string()};
  if (settled_dir(name, m)) {
    remove_temporary(paths.temporary);  // published by another rank, or superseded
    return std::nullopt;
  }
  const int rc = engine_->mkdir(paths.temporary);
  if (rc < 0 && rc != -EEXIST) detail::throw_sys_error(rc, "create directory " + paths.temporary);
  auto present = [&](const FileRecord& f) {
    struct stat st {};
    return ::stat((paths.temporary + "/" + f.name).c_str(), &st) == 0 &&
           static_cast<uint64_t>(st.st_size) == f.size;
  };
  std::set<std::string> in_place;
  for (const FileRecord& f : m.files) {
    if (present(f)) in_place.insert(f.name);
  }
  DrainRecord record;
  record.name = name;
  record.id = m.id;
  copy_share(
      dir, m, in_place, [&](const FileRecord& f) { return !present(f); },
      [&](const FileRecord& f, const format::OpenedFile& src, const std::string& label) {
        const std::string part =
            paths.temporary + "/." + f.name + ".part-r" + std::to_string(config_.node_rank);
        ::unlink(part.c_str());  // a killed copy's
        copy_file(src, label, f, part, record);
        const int moved =
            engine_->rename(part, paths.temporary + "/" + f.name, io::RenameMode::kNoReplace);
        if (moved == -EEXIST) ::unlink(part.c_str());  // placed by another rank meanwhile
        check(moved == -EEXIST ? 0 : moved, "rename " + part + " into place");
      });
  // Whoever finds every file in place commits, under the temporary directory's lock.
  const io::UniqueFd dir_fd(::open(paths.temporary.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) {
    const int err = errno;
    if (err == ENOENT && settled_dir(name, m)) return share_done(record);  // committed
    detail::throw_sys_error(-err, "open " + paths.temporary);
  }
  const io::FileLock lock(dir_fd.get(), /*try_only=*/false);
  if (!lock.locked()) detail::throw_sys_error(-lock.error(), "lock " + paths.temporary);
  if (settled_dir(name, m) || !std::all_of(m.files.begin(), m.files.end(), present)) {
    return share_done(record);  // committed by another rank, or a rank still copying commits
  }
  // Part files of killed copies, and the manifest of a commit killed before its rename.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(paths.temporary, ec)) {
    const std::string entry = e.path().filename().string();
    if (entry.rfind('.', 0) == 0 || entry == kManifestName) ::unlink(e.path().c_str());
  }
  std::string leftover;
  record.bytes += commit_directory(*engine_, paths, text, /*overwrite=*/true, &leftover);
  {
    std::lock_guard<std::mutex> lock_mu(mu_);
    durable_.emplace(name, m.id);
  }
  record.ok = true;
  record.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return record;
}

std::optional<DrainRecord> Drain::share_done(const DrainRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes += record.bytes;
  return std::nullopt;
}

void Drain::upload_file(const format::OpenedFile& src, const std::string& label,
                        const FileRecord& f, const std::string& key, DrainRecord& record) {
  const std::string target =
      s3_->location().str() + "/" +
      key.substr(s3_->location().prefix.empty() ? 0 : s3_->location().prefix.size() + 1);
  if (src.size() != f.size) {
    throw_error(src.size() < f.size ? ErrorCode::kTruncated : ErrorCode::kBadManifest,
                "drain: " + label + " is " + std::to_string(src.size()) +
                    " bytes, the manifest says " + std::to_string(f.size) + "; not uploaded to " +
                    target);
  }
  // Parts of whole chunks, at least 8 MiB (S3's minimum is 5 MiB), at most 10,000 of them.
  constexpr uint64_t kMinPart = 8ull << 20;
  const uint64_t chunk = std::max<uint64_t>(f.chunk_bytes, 1);
  uint64_t part_bytes = chunk * std::max<uint64_t>(1, (kMinPart + chunk - 1) / chunk);
  while ((f.size + part_bytes - 1) / part_bytes > 10000) part_bytes *= 2;
  const size_t parts =
      static_cast<size_t>(std::max<uint64_t>(1, (f.size + part_bytes - 1) / part_bytes));
  // Reads part `p` into `buffer`, checking each chunk's hash before anything is sent.
  auto read_part = [&](size_t p, std::vector<uint8_t>& buffer) -> size_t {
    const uint64_t begin = p * part_bytes;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(part_bytes, f.size - begin));
    buffer.resize(std::max<size_t>(len, 1));
    const int64_t n = io::read_full(src.fd.get(), buffer.data(), len, begin);
    if (n < 0) detail::throw_sys_error(static_cast<int>(n), "read " + label);
    if (static_cast<size_t>(n) != len) {
      throw_error(ErrorCode::kTruncated, "drain: " + label + " ended at byte " +
                                             std::to_string(begin + n) + "; not uploaded to " +
                                             target);
    }
    for (uint64_t at = 0; at < len; at += chunk) {
      const uint64_t c = (begin + at) / chunk;
      const size_t clen = static_cast<size_t>(std::min<uint64_t>(chunk, len - at));
      const uint64_t hash = format::hash64(buffer.data() + at, clen);
      if (hash != f.chunk_hashes[c]) {
        throw_error(ErrorCode::kHashMismatch,
                    "drain: chunk " + std::to_string(c) + " of " + label + " (bytes [" +
                        std::to_string(begin + at) + ", " + std::to_string(begin + at + clen) +
                        ")) has XXH3-64 " + format::hash_hex(hash) + ", the manifest says " +
                        format::hash_hex(f.chunk_hashes[c]) + "; the snapshot is not uploaded to " +
                        target);
      }
    }
    return len;
  };
  io::S3Client& client = s3_->client();
  const std::string& bucket = s3_->location().bucket;
  if (parts == 1) {
    std::vector<uint8_t> buffer;
    const size_t len = read_part(0, buffer);
    pace(len);
    client.put_object(bucket, key, buffer.data(), len);
    record.bytes += len;
    ::posix_fadvise(src.fd.get(), 0, 0, POSIX_FADV_DONTNEED);
    return;
  }
  std::string upload_id;
  std::map<int, io::S3Part> uploaded;  // what an interrupted drain left, by part number
  if (auto it = resumable_.find(key); it != resumable_.end()) {
    upload_id = it->second;
    resumable_.erase(it);
    try {
      for (const io::S3Part& p : client.list_parts(bucket, key, upload_id)) uploaded[p.number] = p;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kNotFound) throw;
      upload_id.clear();  // completed or aborted meanwhile
    }
  }
  if (upload_id.empty()) upload_id = client.create_multipart_upload(bucket, key);
  std::vector<io::S3Part> done(parts);
  std::vector<std::vector<uint8_t>> buffers(kUploadThreads);
  std::atomic<uint64_t> sent{0}, kept{0};
  try {
    detail::run_parallel(parts, kUploadThreads, [&](size_t p, int worker) {
      std::vector<uint8_t>& buffer = buffers[worker];
      const size_t len = read_part(p, buffer);
      const int number = static_cast<int>(p + 1);
      done[p].number = number;
      if (auto it = uploaded.find(number); it != uploaded.end() && it->second.size == len &&
                                           it->second.etag == io::md5_hex(buffer.data(), len)) {
        done[p].etag = it->second.etag;
        kept += len;
        return;
      }
      pace(len);
      done[p].etag = client.upload_part(bucket, key, upload_id, number, buffer.data(), len);
      sent += len;
    });
  } catch (...) {
    // Kept for the next pass (or the next process) to resume: its parts are not sent again.
    resumable_[key] = upload_id;
    throw;
  }
  client.complete_multipart_upload(bucket, key, upload_id, done);
  ::posix_fadvise(src.fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  record.bytes += sent;
  record.resumed_bytes += kept;
}

void Drain::keep_last(DrainRecord& record) {
  if (config_.local_keep_last <= 0) return;
  std::vector<Listed> local;
  for (Listed& l : list(config_.local_root)) {
    if (l.committed) local.push_back(std::move(l));
  }
  std::stable_sort(local.begin(), local.end(), [](const Listed& a, const Listed& b) {
    return format::newer(age_of(*a.manifest), age_of(*b.manifest));
  });
  for (size_t i = static_cast<size_t>(config_.local_keep_last); i < local.size(); ++i) {
    const Listed& l = local[i];
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!durable_.count({l.name, l.manifest->id})) continue;  // never an undrained one
    }
    if (config_.busy && config_.busy(l.name)) continue;
    try {
      remove_snapshot(l.path);
      record.deleted_local.push_back(l.name);
    } catch (const Error&) {
      // Gone already (another remover) or not removable now: the next drain tries again.
    }
  }
}

void Drain::pace(uint64_t bytes) {
  if (stop_) throw Cancelled{};
  if (config_.bytes_per_second == 0) return;
  // Each caller (the drain thread, or an upload thread) takes the next slot of the rate.
  std::unique_lock<std::mutex> lock(mu_);
  const auto now = Clock::now();
  if (next_write_ < now) next_write_ = now;  // no credit for idle time
  const auto slot = next_write_;
  next_write_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
      static_cast<double>(bytes) / static_cast<double>(config_.bytes_per_second)));
  if (cv_.wait_until(lock, slot, [&] { return stop_.load(); })) throw Cancelled{};
}

}  // namespace tsnap::pipeline
