#include "tsnap/snapshotter.h"

#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/glob.h"
#include "common/hidden.h"
#include "common/owner_process.h"
#include "common/sys_error.h"
#include "common/thread_name.h"
#include "dist/coordinator.h"
#include "format/dir_root.h"
#include "format/hash.h"
#include "format/layout.h"
#include "format/manifest_io.h"
#include "format/s3_root.h"
#include "format/safetensors.h"
#include "io/thread_priority.h"
#include "pipeline/agent_client.h"
#include "pipeline/commit.h"
#include "pipeline/drain.h"
#include "pipeline/rank_report.h"
#include "pipeline/resources.h"
#include "pipeline/root_lock.h"
#include "pipeline/save_job.h"
#include "plan/plan.h"
#include "plan/sample_hash.h"
#include "stage/hot_image.h"
#include "stage/staging_reserve.h"
#include "tsnap/catalog.h"
#include "tsnap/dist_group.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"

namespace tsnap {

#if defined(__SANITIZE_THREAD__)
#define TSNAP_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSNAP_UNDER_TSAN 1
#endif
#endif
#ifndef TSNAP_UNDER_TSAN
#define TSNAP_UNDER_TSAN 0
#endif

namespace fs = std::filesystem;

namespace {

// Names each TBB worker that joins a staging arena, once: the caller's thread keeps its name.
class StagingThreadNamer : public tbb::task_scheduler_observer {
 public:
  explicit StagingThreadNamer(tbb::task_arena& arena) : tbb::task_scheduler_observer(arena) {
    observe(true);
  }
  ~StagingThreadNamer() override { observe(false); }
  void on_scheduler_entry(bool worker) override {
    thread_local bool named = false;
    if (worker && !named) {
      detail::name_this_thread("tsnap-stage");
      named = true;
    }
  }
};

}  // namespace

struct TSNAP_HIDDEN Snapshotter::Impl {
  std::optional<pipeline::RootLock> root_lock;  // first member: released after everything else
  detail::OwnerProcess owner;  // a forked child cannot use it (common/owner_process.h)
  pipeline::Resources res;
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;  // saves holding an admission slot
  int running = 0;    // saves whose handle has not completed yet (>= in_flight)
  // Names of the saves whose handle has not completed yet: a second save of one of them is
  // refused at the call (kAlreadyExists) or, with overwrite, ordered after it (see admit).
  std::multiset<std::string> names;
  std::shared_ptr<dist::Coordinator> coordinator;  // distributed saves only
  std::mutex pool_mu;  // guards the creation of res.pool (automatic budget: at the first save)
  std::mutex base_mu;
  std::string last_committed;  // name of the last snapshot a save of this Snapshotter committed
  std::optional<int64_t> last_step;  // and its SaveOptions::step
  // The plans of the last full (not incremental) saves that completed, newest first, without
  // their sources (SaveJob::Learned::plan): a save of a state alike takes one and reuses its
  // layout (plan::Layout::previous), and its job hands it back when it completes. Several, for
  // loops that save a few states in turn (a model, an optimizer), or whose saves overlap.
  // Guarded by base_mu.
  static constexpr size_t kKeptPlans = 4;
  std::deque<plan::Plan> kept_plans;
  // Keeps `plans` (those not moved from), ahead of the kept ones when `newest`.
  void keep_plans(std::deque<plan::Plan> plans, bool newest);
  // The keys whose bytes the last committed save found unchanged since the one before
  // (plan::Layout::unchanged of incremental saves), and its keys' signatures
  // (SaveJob::Learned), which the next save compares its own with (SaveJob::Comparison).
  std::shared_ptr<const std::set<std::string>> unchanged;
  std::shared_ptr<const std::map<std::string, std::vector<uint64_t>>> signatures;
  // The keys whose signatures a committed save has compared with its base's, and for the
  // others (no comparison yet: the first incremental saves of a key) their plan::sample_hash
  // at the last incremental save's start: equal samples put a key among the unchanged (with a
  // comparison, the signatures decide), so that frozen tensors get files of their own at the
  // first incremental save rather than the second. Guarded by base_mu.
  std::shared_ptr<const std::set<std::string>> compared = std::make_shared<std::set<std::string>>();
  std::map<std::string, uint64_t> samples;

  // The base of an incremental save: the last snapshot committed here, else the newest under
  // the root; null when there is none (or it cannot be read: the save is then a full one).
  std::unique_ptr<plan::Base> find_base();
  // An incremental save's plan::Layout::unchanged: what the last committed save found
  // unchanged, and the keys without a comparison yet whose samples are as at the last save.
  std::shared_ptr<const std::set<std::string>> guess_unchanged(const StateDict& state);
  std::unique_ptr<pipeline::Drain> drain;  // with a durable tier (drain.h)
  // keep_hot: the hot images, made with the pool (guarded by pool_mu like it); destroyed before
  // it (~Impl), after every save.
  std::unique_ptr<stage::HotImages> hot;
  // SnapshotterOptions::agent: the link (null without one, or after a fall back at
  // construction).
  std::shared_ptr<pipeline::AgentClient> agent;

  void make_pool(uint64_t budget);
  // make_pool's second half, for a pool made either way.
  void set_up_pool();
  // Links to the agent (before the root's lock: the agent may be committing there).
  void link_agent();
  // Takes over the pool a killed trainer of this root left with the agent, and its hot
  // snapshot where every chunk still hashes as committed.
  void adopt(pipeline::AdoptedPool adopted);
  void start_drain();
  void ensure_pool(const plan::Plan& plan);
  plan::Plan make_save_plan(const StateDict& state, const SaveOptions& options,
                            const std::string& id, const plan::Layout& layout) const;

  SaveHandle start(const std::string& name, const std::string& id, const StateDict& state,
                   const nlohmann::json& metadata, const SaveOptions& options);

  explicit Impl(SnapshotterOptions options);
  ~Impl();
  void admit(const std::string& name, bool overwrite);
  void release_slot(const std::string& name);
  void completed();
};

Snapshotter::Impl::Impl(SnapshotterOptions options) {
  res.options = std::move(options);
  SnapshotterOptions& o = res.options;
  if (o.root.empty()) {
    throw_error(ErrorCode::kInvalidArgument, "SnapshotterOptions::root is empty");
  }
  if (o.chunk_bytes == 0 || o.chunk_bytes % 4096 != 0 || o.chunk_bytes > format::kMaxChunkBytes) {
    throw_error(ErrorCode::kInvalidArgument,
                "chunk_bytes must be a positive multiple of 4096 up to " +
                    std::to_string(format::kMaxChunkBytes) + ", not " +
                    std::to_string(o.chunk_bytes));
  }
  if (o.max_in_flight < 1) {
    throw_error(ErrorCode::kInvalidArgument, "max_in_flight must be >= 1");
  }
  std::error_code ec;
  fs::create_directories(o.root, ec);
  if (ec) {
    throw_error(ErrorCode::kIo,
                "cannot create snapshot root " + o.root.string() + ": " + ec.message(), ec.value());
  }
  if (o.group) coordinator = o.group->coordinator();
  if (!o.agent.socket.empty()) link_agent();
  root_lock.emplace(o.root);  // removes stale temporaries when no other writer is alive

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Eager staging has every core: the caller waits for it, and the copy is its stall. Lazy
  // staging runs while the training does, on half of them.
  int eager_threads = o.staging.threads > 0 ? o.staging.threads : cores;
  int lazy_threads = o.staging.threads > 0 ? o.staging.threads : std::max(1, cores / 2);
#if TSNAP_UNDER_TSAN
  // libtbb is not instrumented: TSan sees none of its hand-offs between the caller and its
  // workers, and reports every task of a wider arena racing with the caller (1,160 reports
  // in the pipeline suite). One thread per arena keeps tsnap's own threads checked.
  eager_threads = lazy_threads = 1;
#endif
  res.arena = std::make_unique<tbb::task_arena>(eager_threads);
  res.lazy_arena = std::make_unique<tbb::task_arena>(lazy_threads);
  for (tbb::task_arena* arena : {res.arena.get(), res.lazy_arena.get()}) {
    res.arena_namers.push_back(std::make_unique<StagingThreadNamer>(*arena));
  }
  const size_t blocking_threads = static_cast<size_t>(o.max_in_flight) + 1;
  res.blocking = std::make_unique<boost::asio::thread_pool>(blocking_threads);
  io::set_up_pool(*res.blocking, blocking_threads, "tsnap-pipeline", o.background_priority);
  io::EngineRequest request;
  request.background = o.background_priority;
  request.kind = o.io.engine;
  request.queue_depth = o.io.queue_depth;
  request.io_threads = o.io.threads;
  res.host = io::host_for_save(request, o.io.direct_io, o.root.string());
  std::optional<pipeline::AdoptedPool> adopted = agent ? agent->take_adopted() : std::nullopt;
  if (adopted && adopted->buffer_bytes == o.chunk_bytes) {
    adopt(std::move(*adopted));
  } else if (o.staging.budget_bytes > 0) {
    make_pool(o.staging.budget_bytes);
  }
  if (o.group && o.tier.node_local && o.tier.durable_root.empty()) {
    // A node's copy holds its ranks' files only: nothing would ever hold the snapshot whole.
    throw_error(ErrorCode::kInvalidArgument,
                "tier.node_local needs tier.durable_root: a snapshot on node-local roots is "
                "whole only once drained there");
  }
  if (!o.tier.durable_root.empty()) start_drain();
}

void Snapshotter::Impl::start_drain() {
  const SnapshotterOptions& o = res.options;
  if (o.tier.local_keep_last < 0) {
    throw_error(ErrorCode::kInvalidArgument, "local_keep_last must be >= 0");
  }
  std::error_code ec;
  if (!format::is_s3(o.tier.durable_root)) fs::create_directories(o.tier.durable_root, ec);
  if (!ec && !format::is_s3(o.tier.durable_root) &&
      fs::equivalent(o.root, o.tier.durable_root, ec)) {
    throw_error(ErrorCode::kInvalidArgument,
                "durable_root " + o.tier.durable_root.string() + " is the root itself");
  }
  // A group's snapshots are one shared directory, each committed by rank 0: rank 0 alone
  // drains them (every rank's files), the others have no drain. On node-local roots every rank
  // drains what its node holds.
  const bool node_local = o.group && o.tier.node_local;
  if (o.group && o.group->rank() != 0 && !node_local) return;
  pipeline::DrainConfig config;
  if (node_local) config.node_rank = o.group->rank();
  config.local_root = o.root;
  config.durable_root = o.tier.durable_root;
  config.bytes_per_second = o.tier.bytes_per_second;
  config.local_keep_last = o.tier.local_keep_last;
  config.background = o.background_priority;
  config.busy = [this](const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    return names.count(name) != 0;
  };
  drain = std::make_unique<pipeline::Drain>(std::move(config));
}

void Snapshotter::Impl::make_pool(uint64_t budget) {
  const SnapshotterOptions& o = res.options;
  const size_t count = std::max<size_t>(2, static_cast<size_t>(budget / o.chunk_bytes));
  if (agent) {
    res.pool = std::make_unique<stage::StagingPool>(count, o.chunk_bytes, /*shared_fd=*/-1);
    agent->share_pool(res.pool->shared_fd(), res.pool->count(), res.pool->buffer_bytes());
  } else {
    res.pool = std::make_unique<stage::StagingPool>(count, o.chunk_bytes, /*pinned=*/true);
  }
  set_up_pool();
}

void Snapshotter::Impl::set_up_pool() {
  const SnapshotterOptions& o = res.options;
  // Every save, the first included, copies into faulted-in pages: the pool is faulted in here,
  // on every core, where the cost is the pool's making (construction with a fixed budget,
  // prepare(), or the first save with the automatic one) and not a later save's stall.
  res.pool->fault_in_now();
  std::vector<iovec> iovs;
  for (size_t i = 0; i < res.pool->count(); ++i) {
    iovs.push_back({res.pool->data(static_cast<int>(i)), res.pool->buffer_bytes()});
  }
  // A background thread registers the buffers with io_uring (pinning them takes a while);
  // writes made before that are plain writes from the same buffers. ~Impl stops it before
  // the host goes.
  io::Engine& engine = res.host->engine();
  res.pool->fault_in_background(o.background_priority, [&engine, iovs = std::move(iovs)] {
    try {
      engine.register_buffers(iovs);
    } catch (...) {
      // advisory: writes stay plain writes
    }
  });
  if (o.staging.keep_hot) hot = std::make_unique<stage::HotImages>(*res.pool);
  if (agent) hot->keep_building();
  // A thread that finds no free buffer gets the kept ones back (hot images) and starts the
  // writes held back (deferred_writes.h): the buffers those hold come back once written.
  res.pool->set_reclaim([images = hot.get(), deferred = &res.deferred] {
    if (images != nullptr) images->reclaim();
    deferred->release_any();
  });
}

void Snapshotter::Impl::link_agent() {
  SnapshotterOptions& o = res.options;
  if (o.group) {
    throw_error(ErrorCode::kInvalidArgument,
                "agent.socket with a group: saves of a group are not handed to an agent yet");
  }
  try {
    agent = std::make_shared<pipeline::AgentClient>(o.agent.socket, fs::absolute(o.root),
                                                    o.agent.fall_back);
  } catch (const Error& e) {
    if (!o.agent.fall_back || e.code() == ErrorCode::kBusy) throw;
    std::cerr << "tsnap: saving without the snapshot agent (agent.fall_back): " << e.what()
              << std::endl;
    return;
  }
  o.staging.keep_hot = true;  // the buffers of a save stay its own until it commits
  o.incremental = false;
}

void Snapshotter::Impl::adopt(pipeline::AdoptedPool a) {
  res.pool = std::make_unique<stage::StagingPool>(a.count, a.buffer_bytes, a.fd.get());
  // The hot snapshot's buffers are verified and taken before set_up_pool() starts the pool's
  // background thread, which takes free buffers out for a while to collapse them.
  std::optional<Manifest> m;
  std::vector<std::vector<int>> taken;  // per manifest file, its chunks' buffers
  try {
    if (!a.hot_name.empty()) {
      m = format::parse_manifest(a.hot_manifest, a.hot_name);
      for (const FileRecord& f : m->files) {
        const std::vector<int>& bufs = a.hot_bufs.at(f.name);
        if (bufs.size() != f.chunk_hashes.size()) throw std::out_of_range("chunk count");
        taken.emplace_back();
        for (uint64_t c = 0; c < f.chunk_hashes.size(); ++c) {
          const int b = bufs[c];
          // A buffer a later save took after this snapshot committed no longer holds it.
          if (b < 0 || static_cast<size_t>(b) >= res.pool->count() ||
              format::hash64(res.pool->data(b), format::chunk_length(f, c)) != f.chunk_hashes[c]) {
            throw std::runtime_error("chunk " + std::to_string(c) + " of " + f.name +
                                     " was overwritten since");
          }
          res.pool->take(b);
          taken.back().push_back(b);
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "tsnap: the snapshot agent's copy of " << a.hot_name
              << " is not usable: " << e.what() << std::endl;
    for (const std::vector<int>& bufs : taken) {
      for (int b : bufs) res.pool->release(b);
    }
    m.reset();
  }
  set_up_pool();
  if (!m) return;
  plan::Plan p;
  for (const FileRecord& f : m->files) {
    plan::PlannedFile file;
    file.name = f.name;
    file.size = f.size;
    file.chunk_bytes = f.chunk_bytes;
    p.files.push_back(std::move(file));
  }
  std::shared_ptr<stage::HotImage> image = hot->begin(p, a.hot_name, res.options.root / a.hot_name);
  for (size_t i = 0; i < taken.size(); ++i) {
    for (size_t c = 0; c < taken[i].size(); ++c) image->keep(i, c, taken[i][c]);
  }
  image->commit(std::move(*m));
}

std::shared_ptr<const std::set<std::string>> Snapshotter::Impl::guess_unchanged(
    const StateDict& state) {
  std::shared_ptr<const std::set<std::string>> learned, seen;
  {
    std::lock_guard<std::mutex> lock(base_mu);
    learned = unchanged;
    seen = compared;
  }
  std::map<std::string, uint64_t> now;  // read outside the lock: the caller's tensors
  for (const auto& [key, entry] : state) {
    if (seen->count(key) != 0) continue;
    if (const std::optional<uint64_t> sample = plan::sample_hash(entry.tensor)) {
      now.emplace(key, *sample);
    }
  }
  std::set<std::string> same;
  {
    std::lock_guard<std::mutex> lock(base_mu);
    for (const auto& [key, sample] : now) {
      const auto it = samples.find(key);
      if (it != samples.end() && it->second == sample) same.insert(key);
    }
    samples = std::move(now);
  }
  if (same.empty()) return learned;
  auto out = std::make_shared<std::set<std::string>>(std::move(same));
  if (learned) out->insert(learned->begin(), learned->end());
  return out;
}

std::unique_ptr<plan::Base> Snapshotter::Impl::find_base() {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(base_mu);
    name = last_committed;
  }
  std::vector<fs::path> candidates;
  if (!name.empty()) candidates.push_back(res.options.root / name);
  try {
    if (std::optional<fs::path> newest = tsnap::latest(res.options.root)) {
      candidates.push_back(*newest);
    }
  } catch (const Error&) {
  }
  for (const fs::path& dir : candidates) {
    try {
      auto base = std::make_unique<plan::Base>();
      base->manifest = read_manifest(dir);
      base->dir = dir.string();
      base->name = dir.filename().string();
      return base;
    } catch (const Error&) {
      // deleted or replaced meanwhile: try the next
    }
  }
  return nullptr;
}

plan::Plan Snapshotter::Impl::make_save_plan(const StateDict& state, const SaveOptions& options,
                                             const std::string& id,
                                             const plan::Layout& layout) const {
  const uint64_t chunk = options.chunk_bytes ? options.chunk_bytes : res.options.chunk_bytes;
  if (chunk > res.options.chunk_bytes) {
    throw_error(ErrorCode::kInvalidArgument, "chunk_bytes " + std::to_string(chunk) +
                                                 " exceeds the Snapshotter's buffer size " +
                                                 std::to_string(res.options.chunk_bytes));
  }
  const plan::RankOf ranks{coordinator ? coordinator->rank() : 0,
                           coordinator ? coordinator->world_size() : 1};
  const int io_threads = std::max(1, res.options.io.threads);
  plan::Plan plan = plan::make_plan(state, options, chunk, id, io_threads, ranks, layout);
  // A rank's hot image holds every entry it restores: the replicated entries that other ranks
  // write are staged too (the stall copies them), into files that stay in memory.
  if (res.options.staging.keep_hot && ranks.world_size > 1) {
    plan::add_memory_files(plan, state, options, chunk, io_threads, ranks);
  }
  return plan;
}

void Snapshotter::Impl::ensure_pool(const plan::Plan& plan) {
  std::lock_guard<std::mutex> lock(pool_mu);
  if (res.pool) return;
  // Automatic budget: this save's chunks (twice with keep_hot: the hot image and the next
  // save's staging), within a quarter of physical memory.
  const uint64_t chunk = res.options.chunk_bytes;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const uint64_t memory = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * page : 8ull << 30;
  const uint64_t cap = std::max<uint64_t>(2, memory / 4 / chunk);
  const uint64_t chunks = plan.chunks.size() * (res.options.staging.keep_hot ? 2 : 1);
  make_pool(std::clamp<uint64_t>(chunks, 2, cap) * chunk);
}

Snapshotter::Impl::~Impl() {
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return running == 0; });
  }
  drain.reset();  // stops a copy in progress (drain.h); the next Snapshotter resumes it
  res.blocking->join();
  // Waits for the hot loads still running (their buffers are the pool's).
  hot.reset();
  if (res.pool) res.pool->stop_background();  // its last step registers buffers with the host
  res.host.reset();  // after every save: closes the ring, then joins the io thread
}

void Snapshotter::Impl::admit(const std::string& name, bool overwrite) {
  std::unique_lock<std::mutex> lock(mu);
  if (names.count(name) != 0) {
    const std::string where = (res.options.root / name).string();
    if (!overwrite) {
      throw_error(ErrorCode::kAlreadyExists,
                  "snapshot " + where +
                      " is being saved already (an earlier save_async of this name is still in "
                      "flight; pass overwrite to replace it once that one completes)");
    }
    if (res.options.in_flight == InFlightPolicy::kFailFast) {
      throw_error(ErrorCode::kBusy, "snapshot " + where +
                                        " is still being saved by an earlier save_async; "
                                        "overwriting it must wait for that one to complete");
    }
    // Overwrite: this save is ordered after the earlier one (its commit replaces the other's).
    cv.wait(lock, [&] { return names.count(name) == 0; });
  }
  if (in_flight >= res.options.max_in_flight) {
    if (res.options.in_flight == InFlightPolicy::kFailFast) {
      throw_error(ErrorCode::kBusy, std::to_string(in_flight) +
                                        " saves are still in flight (max_in_flight = " +
                                        std::to_string(res.options.max_in_flight) + ")");
    }
    cv.wait(lock, [&] { return in_flight < res.options.max_in_flight; });
  }
  ++in_flight;
  ++running;
  names.insert(name);
}

// Runs before the save's handle completes (its commit is done), so that a save started once
// wait() returns is admitted: its slot and its name are free again.
void Snapshotter::Impl::keep_plans(std::deque<plan::Plan> plans, bool newest) {
  std::lock_guard<std::mutex> lock(base_mu);
  for (plan::Plan& p : plans) {
    if (p.entries.empty()) continue;  // moved into a save, or not reusable
    if (newest) {
      kept_plans.push_front(std::move(p));
    } else {
      kept_plans.push_back(std::move(p));
    }
  }
  while (kept_plans.size() > kKeptPlans) kept_plans.pop_back();
}

void Snapshotter::Impl::release_slot(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(mu);
    --in_flight;
    names.erase(names.find(name));
  }
  cv.notify_all();
}

void Snapshotter::Impl::completed() {
  if (drain) drain->request();  // a new local commit (or a failure: a pass is then a no-op)
  {
    std::lock_guard<std::mutex> lock(mu);
    --running;
  }
  cv.notify_all();
}

namespace {

// The deprecated flat names of SnapshotterOptions (tsnap 0.1) moved into their groups.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
SnapshotterOptions with_deprecated_names_applied(SnapshotterOptions o) {
  const SnapshotterOptions d;
  if (o.staging_budget_bytes != d.staging_budget_bytes)
    o.staging.budget_bytes = o.staging_budget_bytes;
  if (o.stage_threads != d.stage_threads) o.staging.threads = o.stage_threads;
  if (o.io_threads != d.io_threads) o.io.threads = o.io_threads;
  if (o.queue_depth != d.queue_depth) o.io.queue_depth = o.queue_depth;
  if (o.engine != d.engine) o.io.engine = o.engine;
  if (o.direct_io != d.direct_io) o.io.direct_io = o.direct_io;
  if (o.durable_root != d.durable_root) o.tier.durable_root = o.durable_root;
  if (o.drain_bytes_per_second != d.drain_bytes_per_second) {
    o.tier.bytes_per_second = o.drain_bytes_per_second;
  }
  if (o.local_keep_last != d.local_keep_last) o.tier.local_keep_last = o.local_keep_last;
  if (o.keep_hot != d.keep_hot) o.staging.keep_hot = o.keep_hot;
  return o;
}
#pragma GCC diagnostic pop

}  // namespace

Snapshotter::Snapshotter(SnapshotterOptions options)
    : impl_(std::make_unique<Impl>(with_deprecated_names_applied(std::move(options)))) {}

Snapshotter::~Snapshotter() {
  // In a forked child the threads the state refers to do not exist: joining them would hang,
  // so the copied state is left alone (the parent still owns the real one).
  if (impl_ && impl_->owner.forked()) (void)impl_.release();
}

SaveHandle Snapshotter::save_async(const std::string& name, const StateDict& state,
                                   const nlohmann::json& metadata, const SaveOptions& options) {
  impl_->owner.check("this Snapshotter");
  dist::Coordinator* coord = impl_->coordinator.get();
  // A distributed save's id is drawn first, so that a failure to start is reported to the
  // other ranks instead of leaving them waiting.
  const std::string id = coord ? coord->save_id(name) : format::new_save_id();
  try {
    return impl_->start(name, id, state, metadata, options);
  } catch (...) {
    if (coord) pipeline::report_no_part(*coord, id, name, std::current_exception());
    throw;
  }
}

void Snapshotter::prepare(const StateDict& state, const SaveOptions& options) {
  impl_->owner.check("this Snapshotter");
  {
    std::lock_guard<std::mutex> lock(impl_->pool_mu);
    if (impl_->res.pool) return;
  }
  impl_->ensure_pool(impl_->make_save_plan(state, options, format::new_save_id(), {}));
}

void reserve_staging_memory(uint64_t bytes, bool wait) { stage::reserve(bytes, wait); }

uint64_t reserved_staging_bytes() { return stage::reserved_bytes(); }

void Snapshotter::abandon(const std::string& name, const std::string& reason) noexcept {
  dist::Coordinator* coord = impl_->coordinator.get();
  if (coord == nullptr) return;
  try {
    const std::string id = coord->save_id(name);
    pipeline::report_no_part(
        *coord, id, name, make_error(ErrorCode::kCancelled, "the save was abandoned: " + reason));
  } catch (...) {
    // The store is gone: the other ranks fail on it too.
  }
}

SaveHandle Snapshotter::Impl::start(const std::string& name, const std::string& id,
                                    const StateDict& state, const nlohmann::json& metadata,
                                    const SaveOptions& options) {
  const auto started = pipeline::SaveJob::Clock::now();
  format::check_snapshot_name(name);
  if (!metadata.is_object() && !metadata.is_null()) {
    throw_error(ErrorCode::kInvalidArgument,
                std::string("metadata must be a JSON object, not ") + metadata.type_name());
  }
  format::check_metadata_writable(metadata);
  for (const std::string& pattern : options.stale.must_change) {
    (void)detail::glob_match(pattern, "");  // a malformed pattern throws, naming it
  }
  const std::string root = res.options.root.string();
  pipeline::CommitPaths paths{root, "", root + "/" + name};
  std::error_code ec;
  if (fs::exists(paths.final, ec)) {
    if (!options.overwrite) {
      throw_error(ErrorCode::kAlreadyExists,
                  "snapshot " + paths.final + " already exists (pass overwrite to replace it)");
    }
    pipeline::check_replaceable(paths.final, pipeline::Replaceable::kManifestFile);
  }
  paths.temporary = root + "/" + format::temporary_name(name, id);
  plan::Layout layout;
  // A save handed to an agent is whole in its buffers: never incremental.
  layout.incremental = !agent && options.incremental.value_or(res.options.incremental);
  std::unique_ptr<plan::Base> base;
  if (layout.incremental) {
    if (coordinator) {
      // Every rank must compare with the same base: the outcome of the saves before this one,
      // which all ranks know alike once they have completed.
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return running == 0; });
    }
    base = find_base();
    layout.base = base.get();
  }
  std::shared_ptr<const std::set<std::string>> unchanged_keys;
  if (layout.incremental) unchanged_keys = guess_unchanged(state);
  layout.unchanged = unchanged_keys.get();
  // This save's own while it plans: the one it reuses goes with its job, the others back.
  std::deque<plan::Plan> previous;
  if (!layout.incremental) {
    std::lock_guard<std::mutex> lock(base_mu);
    previous.swap(kept_plans);
  }
  for (plan::Plan& p : previous) layout.previous.push_back(&p);
  plan::Plan plan;
  try {
    plan = make_save_plan(state, options, id, layout);
  } catch (...) {
    keep_plans(std::move(previous), /*newest=*/false);
    throw;
  }
  keep_plans(std::move(previous), /*newest=*/false);
  try {
    ensure_pool(plan);
    if (agent && plan.chunks.size() > res.pool->count()) {
      throw_error(ErrorCode::kInvalidArgument,
                  "save " + name + " has " + std::to_string(plan.chunks.size()) +
                      " chunks and the staging pool " + std::to_string(res.pool->count()) +
                      ": a snapshot agent needs a pool that holds a whole save (raise "
                      "staging.budget_bytes, or leave it 0, automatic)");
    }
    admit(name, options.overwrite);  // kBusy under InFlightPolicy::kFailFast, among others
  } catch (...) {
    // A plan taken over from an earlier save stays for the next one.
    plan::clear_sources(plan);
    keep_plans(std::deque<plan::Plan>(1, std::move(plan)), /*newest=*/true);
    throw;
  }
  std::shared_ptr<stage::HotImage> image = hot ? hot->begin(plan, name, paths.final) : nullptr;
  std::shared_ptr<pipeline::SaveJob> job;
  try {
    job = std::make_shared<pipeline::SaveJob>(
        res, std::move(plan), std::move(paths),
        metadata.is_null() ? nlohmann::json::object() : metadata, options.overwrite, coordinator,
        started,
        [this, name, step = options.step](bool committed, pipeline::SaveJob::Learned learned) {
          // Before the handle completes: a save started once wait() returns takes this one
          // as its incremental base, and what it found unchanged as its layout's hint.
          if (committed) {
            std::lock_guard<std::mutex> lock(base_mu);
            last_committed = name;
            last_step = step;
            auto same = std::make_shared<std::set<std::string>>(std::move(learned.carried));
            auto seen = std::make_shared<std::set<std::string>>();
            for (const auto& [key, signature] : learned.signatures) {
              if (!signatures) break;
              const auto it = signatures->find(key);
              if (it == signatures->end()) continue;
              seen->insert(key);
              if (it->second == signature) same->insert(key);
            }
            unchanged = std::move(same);
            compared = std::move(seen);
            signatures = std::make_shared<const std::map<std::string, std::vector<uint64_t>>>(
                std::move(learned.signatures));
          }
          if (learned.plan) {
            keep_plans(std::deque<plan::Plan>(1, std::move(*learned.plan)), /*newest=*/true);
          }
          release_slot(name);
        },
        [this] { completed(); }, options.progress);
    job->open_files();
    if (image) job->keep_hot(std::move(image));
    if (agent) job->guard_with(agent);
    pipeline::SaveJob::Comparison comparison;
    {
      std::lock_guard<std::mutex> lock(base_mu);
      comparison = {last_committed, last_step, signatures, options.step, options.stale};
    }
    job->compare_with(std::move(comparison));
  } catch (...) {
    release_slot(name);
    completed();
    throw;
  }
  SaveHandle handle(job->state());
  if (options.staging == Staging::kLazy) {
    job->prepare_sources();  // here: device tensors are ordered after the caller's stream
    boost::asio::post(*res.blocking, [job] { job->stage(/*lazy=*/true); });
  } else {
    job->stage();
  }
  {
    std::lock_guard<std::mutex> lock(job->state()->mu);
    job->state()->stats.stall_s =
        std::chrono::duration<double>(pipeline::SaveJob::Clock::now() - started).count();
  }
  return handle;
}

void Snapshotter::wait_all() {
  impl_->owner.check("this Snapshotter");
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->running == 0; });
}

const fs::path& Snapshotter::root() const { return impl_->res.options.root; }

uint64_t Snapshotter::staging_budget_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->pool_mu);
  const auto& pool = impl_->res.pool;
  return pool ? pool->count() * pool->buffer_bytes() : 0;
}

const std::shared_ptr<DistGroup>& Snapshotter::group() const { return impl_->res.options.group; }

std::string Snapshotter::engine_name() const { return impl_->res.host->name(); }

std::optional<fs::path> Snapshotter::latest() const {
  std::optional<fs::path> local;
  if (impl_->res.options.group && tier().node_local) {
    // A node's copy counts only where it holds every file.
    format::SnapshotAge best;
    for (const Listed& l : list(root())) {
      if (!l.committed || !format::holds_every_file(l.path, *l.manifest)) continue;
      const format::SnapshotAge age = format::age_of(*l.manifest);
      if (!local || format::newer(age, best)) {
        local = l.path;
        best = age;
      }
    }
  } else {
    local = tsnap::latest(root());
  }
  if (durable_root().empty()) return local;
  std::optional<fs::path> durable;
  try {
    durable = tsnap::latest(durable_root());
  } catch (const IoError&) {
    if (local) return local;  // the durable tier is unreachable (a store that is down)
    throw;
  }
  if (!local || !durable) return local ? local : durable;
  try {
    const Manifest a = read_manifest(*local), b = read_manifest(*durable);
    const format::SnapshotAge local_age = format::age_of(a);
    const format::SnapshotAge durable_age = format::age_of(b);
    return format::newer(durable_age, local_age) ? durable : local;  // a tie: the local one
  } catch (const Error&) {
    return local;  // one was removed or replaced since: ask again for an exact answer
  }
}

const fs::path& Snapshotter::durable_root() const { return impl_->res.options.tier.durable_root; }

const TierOptions& Snapshotter::tier() const { return impl_->res.options.tier; }

void Snapshotter::drain_wait() {
  impl_->owner.check("this Snapshotter");
  if (impl_->drain) impl_->drain->wait();
}

bool Snapshotter::drained(const std::string& name) const {
  return impl_->drain && impl_->drain->drained(name);
}

DrainStats Snapshotter::drain_stats() const {
  return impl_->drain ? impl_->drain->stats() : DrainStats{};
}

int Snapshotter::add_drain_listener(std::function<void(const DrainRecord&)> fn) {
  return impl_->drain ? impl_->drain->add_listener(std::move(fn)) : -1;
}

void Snapshotter::remove_drain_listener(int id) {
  if (impl_->drain) impl_->drain->remove_listener(id);
}

HotSnapshot Snapshotter::hot_snapshot() const {
  std::lock_guard<std::mutex> lock(impl_->pool_mu);
  return impl_->hot ? impl_->hot->snapshot() : HotSnapshot();
}

}  // namespace tsnap
