/// \file
/// The drain of a two-tier Snapshotter; the protocol and its passes are in drain.h. The copy
/// of one snapshot, step by step:
///   1. `SnapshotDir::open(<local>/<name>)`, then MANIFEST.json read through that descriptor
///      and parsed (the bytes are kept: the durable manifest is the same text);
///   2. DurableStore::settled: the durable root holds the same id (known durable) or a newer
///      save (superseded): nothing to copy;
///   3. DurableStore::begin, then for each file of the manifest, in manifest order (node-local
///      roots: the node's files this rank claims, its own first): open it relative to the local
///      directory (gone and the local name replaced or removed meanwhile: abandon, the newer
///      save is drained by its own pass) and write it through the save (CheckedSource checks
///      every chunk before any of it leaves), unless the save links it;
///   4. DurableSave::publish: the manifest last (node-local roots: by whichever rank finds
///      every file in place).
/// The store's units (dir_store.cpp, s3_store.cpp) spell out what each step is there.

#include "pipeline/drain.h"

#include <algorithm>
#include <map>
#include <vector>

#include "common/sys_error.h"
#include "common/thread_name.h"
#include "format/layout.h"
#include "format/manifest_io.h"
#include "format/open_file.h"
#include "io/fd.h"
#include "io/thread_priority.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"
#include "tsnap/remove.h"

namespace tsnap::pipeline {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

}  // namespace

Drain::Drain(DrainConfig config) : config_(std::move(config)) {
  DurableConfig durable;
  durable.root = config_.durable_root;
  durable.engine = config_.engine ? config_.engine : io::make_pwrite_engine(1, config_.background);
  durable.pace = [this](uint64_t bytes) { pace(bytes); };
  durable.node_rank = config_.node_rank;
  store_ = DurableStore::open(std::move(durable));
  // A remote store is first asked on the drain thread: a store that is down or refuses the
  // credentials fails drains, never the Snapshotter.
  if (!store_->remote()) open_store();
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
  const std::vector<Save> saves = store_->saves();
  std::lock_guard<std::mutex> lock(mu_);
  durable_.insert(saves.begin(), saves.end());
  store_open_ = true;
}

void Drain::pass() {
  if (!store_open_) open_store();
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

std::optional<DrainRecord> Drain::drain_one(const fs::path& local, const std::string& name) {
  const auto started = Clock::now();
  // 1. The local snapshot, opened once.
  std::optional<format::SnapshotDir> dir;
  std::string text;
  try {
    dir.emplace(format::SnapshotDir::open(local));
    text = format::manifest_text_in(*dir);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound) throw Abandoned{};  // removed since the listing
    throw;
  }
  const Manifest m = format::parse_manifest(text, dir->label(kManifestName));

  // 2. Durable already, or superseded there.
  if (store_->settled(name, m)) {
    std::lock_guard<std::mutex> lock(mu_);
    durable_.emplace(name, m.id);
    return std::nullopt;
  }

  // 3. The files.
  const bool shared = config_.node_rank >= 0;
  const std::unique_ptr<DurableSave> save = store_->begin(name, m, shared);
  DrainRecord record;
  record.name = name;
  record.id = m.id;
  auto write = [&](const FileRecord& f, const format::OpenedFile& src, const std::string& label) {
    save->write(CheckedSource(src, label, f, save->where(f)), record);
  };
  if (shared) {
    copy_share(
        *dir, m, save->in_place(), [&](const FileRecord& f) { return !save->has(f); }, write);
  } else {
    for (const FileRecord& f : m.files) {
      if (save->link(f)) {
        record.linked_bytes += f.size;
        continue;
      }
      write(f, open_source(*dir, f), dir->label(f.name));
    }
  }

  // 4. The manifest last.
  if (!save->publish(text, record)) return share_done(record);
  {
    std::lock_guard<std::mutex> lock(mu_);
    durable_.emplace(name, m.id);
  }
  record.ok = true;
  record.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return record;
}

format::OpenedFile Drain::open_source(const format::SnapshotDir& dir, const FileRecord& f) const {
  try {
    return format::open_snapshot_file(dir, f.name, "shard");
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound && dir.replaced()) throw Abandoned{};
    throw;
  }
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

std::optional<DrainRecord> Drain::share_done(const DrainRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes += record.bytes;
  return std::nullopt;
}

void Drain::keep_last(DrainRecord& record) {
  if (config_.local_keep_last <= 0) return;
  std::vector<Listed> local;
  for (Listed& l : list(config_.local_root)) {
    if (l.committed) local.push_back(std::move(l));
  }
  std::stable_sort(local.begin(), local.end(), [](const Listed& a, const Listed& b) {
    return format::newer(format::age_of(*a.manifest), format::age_of(*b.manifest));
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
