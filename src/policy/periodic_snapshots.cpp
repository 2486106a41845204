#include "tsnap/periodic_snapshots.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "common/hidden.h"
#include "common/owner_process.h"
#include "common/sys_error.h"
#include "common/thread_name.h"
#include "dist/coordinator.h"
#include "format/dir_root.h"
#include "format/layout.h"
#include "policy/rank_triggers.h"
#include "policy/retention.h"
#include "policy/signal_chain.h"
#include "policy/summary.h"
#include "tsnap/catalog.h"
#include "tsnap/checkpoint.h"
#include "tsnap/dist_group.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"
#include "tsnap/remove.h"
#include "tsnap/snapshotter.h"

namespace tsnap {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* to_string(SnapshotReason reason) noexcept {
  switch (reason) {
    case SnapshotReason::kSteps:
      return "steps";
    case SnapshotReason::kTime:
      return "time";
    case SnapshotReason::kSignal:
      return "signal";
    case SnapshotReason::kContinuous:
      return "continuous";
  }
  return "?";
}

double PeriodicStats::stall_s() const {
  double total = 0;
  for (const SnapshotRecord& r : snapshots) total += r.blocked_s;
  return total;
}

uint64_t PeriodicStats::bytes() const {
  uint64_t total = 0;
  for (const SnapshotRecord& r : snapshots) total += r.committed ? r.save.bytes : 0;
  return total;
}

void PeriodicOptions::log_to_stderr(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
}

struct TSNAP_HIDDEN PeriodicSnapshots::Impl {
  Impl(Snapshotter& snapshotter, Schedule schedule, MakeCheckpoint make, PeriodicOptions options);
  ~Impl();

  // Training thread.
  void after_step_distributed(int64_t step);
  bool continuous_due() const;
  void start_save(int64_t step, SnapshotReason reason, Clock::time_point began);
  // Removes a periodic snapshot of `name` under the root whose manifest does not read (left by
  // an abandoned run), which the save's overwrite would refuse; logs what it did.
  void replace_unreadable(const std::string& name);
  void final_snapshot(int64_t step, int sig, Clock::time_point began);
  void restart_timer();
  void wait_processed();
  void log(const std::string& line);
  void report(const SnapshotRecord& record);

  // Hook thread: timers, signals and (in a group) the trigger polls, none of which blocks.
  void arm_timer(uint64_t epoch);
  // Sizes and faults in the Snapshotter's staging pool for this hook's checkpoint
  // (Snapshotter::prepare), once: at the first after_step.
  void prepare();
  bool prepared = false;  // training thread

  // Completion thread: retention (file system work, which can take seconds when fsync is slow)
  // and the user's callbacks, kept off the hook thread so that trigger polls stay on time.
  void on_completed(SnapshotRecord record, const SaveHandle& handle, std::exception_ptr error);

  // Drain thread (a two-tier Snapshotter): retention of both tiers after each drain.
  void on_drained(const DrainRecord& record);
  // Distributed resume: every rank reports the snapshots (name, save id) it can resume from,
  // newest first; rank 0 picks the first of its own that every rank reported. nullopt: none.
  std::optional<std::pair<std::string, std::string>> agree_on_resume(
      const std::vector<std::pair<std::string, std::string>>& usable);

  detail::OwnerProcess owner;
  Snapshotter& snapshotter;
  const Schedule schedule;
  const MakeCheckpoint make_checkpoint;
  const PeriodicOptions options;

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  asio::steady_timer timer{io};
  policy::SignalChain signals{io};
  std::thread thread;
  asio::thread_pool completions{1};  // on_completed, in completion order
  std::mutex post_mu;                // held while a completion is posted to `completions`

  std::atomic<bool> time_due{false};
  std::atomic<uint64_t> timer_epoch{0};  // a timer armed before the latest restart never fires
  std::atomic<int> signal_pending{0};
  std::atomic<int> stop_signal{0};

  // Training thread only.
  SaveHandle current;
  std::optional<int64_t> last_step;
  Clock::time_point last_began = Clock::now();  // of the last snapshot, or the hook's start
  double last_blocked_s = 0;                    // of the last snapshot
  int64_t proposal_pending_until = 0;           // distributed rank 0: a continuous trigger's step

  // Distributed hooks (the Snapshotter has a DistGroup): a snapshot due by time (rank 0's
  // timer) or by a signal (on any rank) is agreed on through the group's store as a trigger for
  // a step a little ahead (policy/rank_triggers.h), and every rank saves at that step.
  // Steps-based snapshots need no agreement.
  dist::Coordinator* coord = nullptr;
  std::optional<policy::RankTriggers> triggers;
  // Training thread: when after_step last returned, where the training's own time of a step
  // (without the hook's) starts.
  Clock::time_point last_after_step{};

  mutable std::mutex mu;
  std::condition_variable cv;
  PeriodicStats stats;
  int pending = 0;                // saves started whose completion is not yet processed
  std::exception_ptr unreported;  // first failure not thrown yet
  std::mutex log_mu;
  int drain_listener = -1;  // with a durable tier: on_drained's id
};

namespace {

// The name under which the ranks agree on the snapshot to resume from (no snapshot's name
// holds a '/').
constexpr const char* kResumeAgreement = "/resume";

void wait_quietly(const SaveHandle& handle) {
  try {
    handle.wait();
  } catch (...) {
  }
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

PeriodicSnapshots::Impl::Impl(Snapshotter& snap, Schedule sched, MakeCheckpoint make,
                              PeriodicOptions opts)
    : snapshotter(snap),
      schedule(std::move(sched)),
      make_checkpoint(std::move(make)),
      options(std::move(opts)) {
  if (!make_checkpoint) {
    throw_error(ErrorCode::kInvalidArgument, "PeriodicSnapshots: make_checkpoint is null");
  }
  try {
    signals.install(schedule.options().on_signals);
    if (const auto& group = snapshotter.group()) {
      coord = group->coordinator().get();
      triggers.emplace(*coord, io, [this](const std::string& line) { log(line); });
    }
    if (!schedule.options().on_signals.empty()) {
      signals.start([this](int sig) {
        int none = 0;
        signal_pending.compare_exchange_strong(none, sig);
      });
    }
    // In a group, rank 0's clock decides time-based snapshots for all.
    if (schedule.options().every_seconds > 0 && (!coord || coord->rank() == 0)) arm_timer(0);
    if (triggers) triggers->start_polling();
    asio::post(completions, [] { detail::name_this_thread("tsnap-callback"); });
    thread = std::thread([this] {
      detail::name_this_thread("tsnap-hook");
      io.run();
    });
    if (!snapshotter.durable_root().empty()) {
      drain_listener =
          snapshotter.add_drain_listener([this](const DrainRecord& r) { on_drained(r); });
    }
  } catch (...) {
    signals.close();
    throw;
  }
}

PeriodicSnapshots::Impl::~Impl() {
  if (drain_listener >= 0) snapshotter.remove_drain_listener(drain_listener);
  if (current.valid()) wait_quietly(current);
  wait_processed();
  { std::lock_guard<std::mutex> lock(post_mu); }  // every post() has returned
  completions.join();
  asio::post(io, [this] {
    timer.cancel();
    if (triggers) triggers->cancel();
    signals.close();  // the previous dispositions come back
  });
  work.reset();
  thread.join();
}

void PeriodicSnapshots::Impl::log(const std::string& line) {
  if (!options.log) return;
  std::lock_guard<std::mutex> lock(log_mu);
  try {
    options.log(line);
  } catch (...) {
    // A throwing log callback must not take the hook's thread down.
  }
}

void PeriodicSnapshots::Impl::report(const SnapshotRecord& record) {
  if (!options.on_snapshot) return;
  std::lock_guard<std::mutex> lock(log_mu);
  try {
    options.on_snapshot(record);
  } catch (...) {
    // Like log: a logger's failure must not take the hook's thread down.
  }
}

void PeriodicSnapshots::Impl::arm_timer(uint64_t epoch) {
  const auto period = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(schedule.options().every_seconds));
  timer.expires_after(period);
  timer.async_wait([this, epoch](const boost::system::error_code& ec) {
    if (!ec && epoch == timer_epoch.load()) time_due.store(true);
  });
}

void PeriodicSnapshots::Impl::restart_timer() {
  if (schedule.options().every_seconds <= 0) return;
  time_due.store(false);
  const uint64_t epoch = ++timer_epoch;
  asio::post(io, [this, epoch] { arm_timer(epoch); });
}

void PeriodicSnapshots::Impl::replace_unreadable(const std::string& name) {
  if (coord && coord->rank() != 0) return;  // rank 0 alone commits, and replaces
  const fs::path path = snapshotter.root() / name;
  std::error_code ec;
  if (!fs::exists(path / kManifestName, ec)) return;
  try {
    (void)read_manifest(path);
    return;  // a snapshot: the save's overwrite replaces it atomically
  } catch (const Error& e) {
    // A periodic snapshot of an abandoned run that does not read (resume skipped it): the
    // save's overwrite would refuse it, as it refuses anything that is not a snapshot.
    log("tsnap: replacing " + name + ", which does not read (" + detail::first_line(e.what()) +
        ")");
  }
  try {
    remove_snapshot(path);
  } catch (const std::exception& e) {
    log("tsnap: could not remove " + name + ": " + detail::first_line(e.what()));
  }
}

void PeriodicSnapshots::Impl::start_save(int64_t step, SnapshotReason reason,
                                         Clock::time_point began) {
  Checkpoint checkpoint = make_checkpoint();
  checkpoint.metadata()[format::kStepKey] = step;
  SaveOptions save = options.save;
  save.overwrite = true;
  save.step = step;
  if (!options.stale_check) {
    save.stale.must_change.clear();
  } else if (save.stale.must_change.empty()) {
    save.stale.must_change = optimizer_moment_keys();
  }
  SnapshotRecord record;
  record.step = step;
  record.name = format::step_name(step);
  record.reason = reason;
  replace_unreadable(record.name);
  {
    std::lock_guard<std::mutex> lock(mu);
    ++pending;
  }
  SaveHandle handle;
  try {
    handle = snapshotter.save_async(record.name, checkpoint, save);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu);
      --pending;
    }
    cv.notify_all();
    throw;
  }
  current = handle;
  last_step = step;
  record.blocked_s = seconds_since(began);
  last_began = began;
  last_blocked_s = record.blocked_s;
  handle.on_complete([this, record, handle](std::exception_ptr error) {
    // Under post_mu until post() has returned (it signals the pool's thread after queuing):
    // the destructor takes post_mu before it destroys the pool.
    std::lock_guard<std::mutex> lock(post_mu);
    asio::post(completions, [this, record, handle, error] { on_completed(record, handle, error); });
  });
}

void PeriodicSnapshots::Impl::on_completed(SnapshotRecord record, const SaveHandle& handle,
                                           std::exception_ptr error) {
  record.save = handle.stats();
  record.committed = error == nullptr;
  if (error) {
    record.error = detail::message_of(error);
  } else if (!snapshotter.durable_root().empty()) {
    // Two tiers: retention runs after the drain (on_drained), where both tiers are known.
  } else if (!coord || coord->rank() == 0) {  // in a group, rank 0 alone deletes
    try {
      record.deleted = policy::apply_retention(snapshotter.root(), schedule, record.step);
    } catch (const std::exception& e) {
      log("tsnap: retention after " + record.name + " stopped: " + e.what());
    }
  }
  const std::string line = policy::snapshot_line(record);
  report(record);
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.deleted += static_cast<int64_t>(record.deleted.size());
    if (error) {
      ++stats.failed;
      if (!unreported) unreported = error;
    }
    stats.snapshots.push_back(std::move(record));
  }
  log(line);
  {
    std::lock_guard<std::mutex> lock(mu);
    --pending;
  }
  cv.notify_all();
}

void PeriodicSnapshots::Impl::on_drained(const DrainRecord& record) {
  const std::string durable = snapshotter.durable_root().string();
  if (!record.ok) {
    log("tsnap: drain of " + record.name + " to " + durable + " FAILED: " + record.error);
    return;
  }
  // The schedule's keep rules, on each tier separately; the local tier keeps what is not
  // drained yet (a snapshot committed after this one, or one whose drain failed).
  std::vector<std::string> deleted_durable, deleted_local;
  const std::optional<int64_t> step = format::parse_step_name(record.name);
  if (step && schedule.retains()) {
    try {
      deleted_durable = policy::apply_retention(durable, schedule, *step);
    } catch (const std::exception& e) {
      log("tsnap: durable retention after " + record.name + " stopped: " + e.what());
    }
    // Node-local roots: the rank that published is on one node of many; every node's drain
    // keeps tier.local_keep_last of its own.
    if (!(coord && snapshotter.tier().node_local)) {
      try {
        deleted_local = policy::apply_retention(
            snapshotter.root(), schedule, *step, {},
            [this](const std::string& name) { return snapshotter.drained(name); });
      } catch (const std::exception& e) {
        log("tsnap: local retention after " + record.name + " stopped: " + e.what());
      }
    }
  }
  for (const std::string& name : record.deleted_local) deleted_local.push_back(name);
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.deleted += static_cast<int64_t>(deleted_durable.size());
  }
  char figures[96];
  std::snprintf(figures, sizeof figures, " (%.1f MB in %.2f s, %.1f MB/s)", record.bytes / 1e6,
                record.seconds, record.seconds > 0 ? record.bytes / 1e6 / record.seconds : 0.0);
  std::string line = "tsnap: " + record.name + " drained to " + durable + figures;
  auto names = [](const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& n : v) out += (out.empty() ? "" : ", ") + n;
    return out;
  };
  if (!deleted_durable.empty()) line += "; durable retention deleted " + names(deleted_durable);
  if (!deleted_local.empty()) line += "; local tier removed " + names(deleted_local);
  log(line);
}

void PeriodicSnapshots::Impl::wait_processed() {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return pending == 0; });
}

bool PeriodicSnapshots::Impl::continuous_due() const {
  const std::optional<double> interval = schedule.continuous_interval(last_blocked_s);
  if (!interval) return false;
  if (current.valid() && !current.done()) return false;
  return seconds_since(last_began) >= *interval;
}

void PeriodicSnapshots::Impl::after_step_distributed(int64_t step) {
  if (triggers->ended()) return;  // logged once; nothing can be agreed any more
  const Clock::time_point now = Clock::now();
  if (last_after_step != Clock::time_point{}) {
    triggers->add_step_time(std::chrono::duration<double>(now - last_after_step).count());
  }
  if (const int sig = signal_pending.exchange(0); sig != 0) {
    triggers->propose(step, SnapshotReason::kSignal, sig);
  }
  if (time_due.exchange(false)) {
    triggers->propose(step, SnapshotReason::kTime, 0);
    restart_timer();
  }
  // Continuous and adaptive snapshots: rank 0 decides (whether the previous save is done
  // differs between ranks) and proposes one at a time.
  if (coord->rank() == 0 && step > proposal_pending_until && continuous_due()) {
    proposal_pending_until = triggers->propose(step, SnapshotReason::kContinuous, 0);
  }
  // Triggers of steps already passed are reported failed to the group by take().
  const auto [due, missed] = triggers->take(step);
  // A signal's trigger learned too late (training without collectives in lockstep, or a hook
  // thread starved for longer than the lead) still stops this rank, as it stopped the others;
  // its final snapshot failed on every rank, so this throws like a failed final snapshot.
  for (const policy::Trigger& t : missed) {
    if (t.reason != SnapshotReason::kSignal) continue;
    if (current.valid()) wait_quietly(current);
    wait_processed();
    stop_signal.store(t.sig);
    const std::string what = "signal " + std::to_string(t.sig) + " at step " +
                             std::to_string(t.step) + " (rank " + std::to_string(coord->rank()) +
                             " learned of it only at step " + std::to_string(step) +
                             "): the final snapshot FAILED, stop";
    log("tsnap: " + what);
    throw_error(ErrorCode::kPeerFailed, what);
  }
  if (due && due->reason == SnapshotReason::kSignal) {
    final_snapshot(step, due->sig, now);
    return;
  }
  SnapshotReason reason;
  if (schedule.due_at_step(step)) {
    reason = SnapshotReason::kSteps;
  } else if (due) {
    reason = due->reason;
  } else {
    return;
  }
  if (last_step == step) return;
  // Always wait for the previous save: whether it is done differs between ranks by a few
  // milliseconds, so a skip decided by each rank alone could differ too.
  if (current.valid() && !current.done()) wait_quietly(current);
  start_save(step, reason, now);
}

void PeriodicSnapshots::Impl::final_snapshot(int64_t step, int sig, Clock::time_point began) {
  if (current.valid()) wait_quietly(current);
  // A snapshot of this very step (due by steps when the signal came) is final if it committed.
  const bool have = last_step == step && current.valid() && current.error() == nullptr;
  std::exception_ptr error;
  if (!have) {
    try {
      start_save(step, SnapshotReason::kSignal, began);
      wait_quietly(current);
      error = current.error();
    } catch (...) {
      error = std::current_exception();
    }
  }
  wait_processed();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (unreported == error) unreported = nullptr;  // thrown here, not again by finish()
  }
  stop_signal.store(sig);
  log("tsnap: signal " + std::to_string(sig) + " at step " + std::to_string(step) +
      (error ? ": the final snapshot FAILED, stop" : ": final snapshot committed, stop"));
  if (error) std::rethrow_exception(error);
}

PeriodicSnapshots::PeriodicSnapshots(Snapshotter& snapshotter, Schedule schedule,
                                     MakeCheckpoint make_checkpoint, PeriodicOptions options)
    : impl_(std::make_unique<Impl>(snapshotter, std::move(schedule), std::move(make_checkpoint),
                                   std::move(options))) {}

PeriodicSnapshots::~PeriodicSnapshots() {
  // In a forked child the hook's threads do not exist (common/owner_process.h).
  if (impl_ && impl_->owner.forked()) (void)impl_.release();
}

namespace {

struct Candidate {
  format::SnapshotAge age;
  std::filesystem::path path;
  std::string name, id;
  bool local = false;  // under the Snapshotter's own root
};

// Whether a candidate can be loaded from where it is: a committed durable copy is whole; on
// node-local roots a node's copy holds only its ranks' files.
bool complete_here(const Candidate& c, const Manifest& m) {
  return !c.local || format::holds_every_file(c.path, m);
}

}  // namespace

int64_t PeriodicSnapshots::resume(const ApplyCheckpoint& apply) {
  Impl& m = *impl_;
  std::vector<Candidate> candidates;
  // Both tiers of a two-tier Snapshotter: the local one first, so that it wins a tie (the same
  // snapshot in both), and the durable copy is the fallback when the local one fails to load.
  std::vector<std::filesystem::path> roots{m.snapshotter.root()};
  if (!m.snapshotter.durable_root().empty()) roots.push_back(m.snapshotter.durable_root());
  for (const std::filesystem::path& root : roots) {
    std::vector<Listed> listed;
    try {
      listed = list(root);
    } catch (const IoError& e) {
      if (root == roots.front()) throw;
      // The durable tier is unreachable (a store that is down): resume from the local one.
      m.log("tsnap: resume cannot list " + root.string() + " (" + detail::first_line(e.what()) +
            "); resuming from " + roots.front().string());
      continue;
    }
    for (const Listed& l : listed) {
      if (!l.committed) {
        m.log("tsnap: resume skips " + (roots.size() > 1 ? l.path.string() : l.name) + ": " +
              l.problem);
        continue;
      }
      const format::SnapshotAge age = format::age_of(*l.manifest);
      if (!age.step) continue;  // only periodic snapshots resume
      Candidate c{age, l.path, l.name, l.manifest->id, root == roots.front()};
      if (!complete_here(c, *l.manifest)) continue;
      candidates.push_back(std::move(c));
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     return format::newer(a.age, b.age);  // the order of tsnap::latest()
                   });
  auto label = [&](const Candidate& c) {
    return roots.size() > 1 ? c.path.string() : c.path.filename().string();
  };
  // A snapshot in memory: a trainer restarted under a snapshot agent (tsnap/agent.h) adopts
  // the last one its predecessor committed. Loaded from there (every chunk verified) unless a
  // snapshot on a root is newer; a copy that does not load falls back to the roots.
  if (HotSnapshot hot = m.coord ? HotSnapshot() : m.snapshotter.hot_snapshot()) {
    const format::SnapshotAge age = format::age_of(hot.manifest());
    if (age.step && (candidates.empty() || !format::newer(candidates.front().age, age))) {
      std::optional<Checkpoint> in_memory;
      try {
        in_memory = load_checkpoint(hot);
      } catch (const Error& e) {
        m.log("tsnap: resume skips the in-memory copy of " + hot.name() + ": " + e.what());
      }
      if (in_memory) {
        apply(*in_memory);
        m.last_step = *age.step;
        m.log("tsnap: resumed from " + hot.name() + " (step " + std::to_string(*age.step) +
              ") in memory");
        return *age.step;
      }
    }
  }
  // The newest candidate that loads (a corrupt one is skipped, as on every rank alike).
  std::optional<Checkpoint> checkpoint;
  size_t loaded = candidates.size();
  for (size_t i = 0; i < candidates.size() && !checkpoint; ++i) {
    try {
      checkpoint = load_checkpoint(candidates[i].path);
      loaded = i;
    } catch (const Error& e) {
      m.log("tsnap: resume skips " + candidates[i].path.filename().string() + ": " + e.what());
    }
  }
  if (m.coord && m.snapshotter.tier().node_local) {
    // On node-local roots ranks see different snapshots (a node's copy, a lost disk): they
    // agree on the newest that every rank has from the one it loaded on, and a rank that
    // loaded a newer one loads that instead.
    std::vector<std::pair<std::string, std::string>> usable;
    for (size_t i = loaded; i < candidates.size(); ++i) {
      usable.emplace_back(candidates[i].name, candidates[i].id);
    }
    const std::optional<std::pair<std::string, std::string>> chosen = m.agree_on_resume(usable);
    if (!chosen) {
      checkpoint.reset();
      loaded = candidates.size();
    } else if (loaded == candidates.size() || candidates[loaded].name != chosen->first ||
               candidates[loaded].id != chosen->second) {
      auto it = std::find_if(
          candidates.begin() + static_cast<std::ptrdiff_t>(loaded), candidates.end(),
          [&](const Candidate& c) { return c.name == chosen->first && c.id == chosen->second; });
      // Present: the agreement took it from this rank's own list.
      loaded = static_cast<size_t>(it - candidates.begin());
      try {
        checkpoint = load_checkpoint(it->path);
      } catch (const Error& e) {
        throw_error(ErrorCode::kPeerFailed,
                    "resume: rank " + std::to_string(m.coord->rank()) + " cannot load " +
                        label(*it) + ", the newest snapshot every rank has: " + e.what());
      }
    }
  }
  if (!checkpoint) {
    m.log("tsnap: nothing to resume under " + m.snapshotter.root().string() + ", starting at 0");
    return 0;
  }
  const Candidate& c = candidates[loaded];
  apply(*checkpoint);
  const int64_t step = *c.age.step;
  m.last_step = step;
  m.log("tsnap: resumed from " + label(c) + " (step " + std::to_string(step) + ")");
  return step;
}

std::optional<std::pair<std::string, std::string>> PeriodicSnapshots::Impl::agree_on_resume(
    const std::vector<std::pair<std::string, std::string>>& usable) {
  using Choice = std::pair<std::string, std::string>;
  dist::Coordinator& c = *coord;
  const std::string id = c.save_id(kResumeAgreement);
  c.publish(id, nlohmann::json(usable).dump());
  if (c.rank() != 0) {
    const nlohmann::json verdict = nlohmann::json::parse(c.outcome(id));
    try {
      c.acknowledge(id);
    } catch (const Error&) {
      // Rank 0 then waits for this rank until its timeout; the verdict stands.
    }
    if (verdict.is_null()) return std::nullopt;
    if (verdict.is_object()) {
      throw_error(ErrorCode::kPeerFailed, "resume: rank 0 could not agree on a snapshot: " +
                                              verdict.value("error", std::string("(no message)")));
    }
    return verdict.get<Choice>();
  }
  std::optional<Choice> chosen;
  try {
    std::vector<std::set<Choice>> others;
    for (const std::string& report : c.gather(id)) {
      others.push_back(nlohmann::json::parse(report).get<std::set<Choice>>());
    }
    for (const Choice& mine : usable) {
      if (std::all_of(others.begin(), others.end(),
                      [&](const std::set<Choice>& o) { return o.count(mine) != 0; })) {
        chosen = mine;
        break;
      }
    }
  } catch (const std::exception& e) {
    // The others fail at once too, rather than wait for their timeout or start from nothing.
    c.decide(id, nlohmann::json{{"error", e.what()}}.dump());
    throw;
  }
  c.decide(id, chosen ? nlohmann::json(*chosen).dump() : "null");
  c.await_acknowledgements(id, c.world_size() - 1);
  if (!chosen) {
    log("tsnap: no snapshot is complete for every rank (on its node or in the durable root)");
  }
  return chosen;
}

void PeriodicSnapshots::Impl::prepare() {
  // At the first step, when the state is complete (an optimizer makes its moments at its
  // first step): the first snapshot then stalls like the later ones. A failure here would
  // fail that snapshot too, which reports it; the step goes on.
  prepared = true;
  try {
    snapshotter.prepare(make_checkpoint(), options.save);
  } catch (const std::exception& e) {
    log(std::string("tsnap: could not prepare the staging buffers: ") +
        detail::first_line(e.what()));
  }
}

void PeriodicSnapshots::after_step(int64_t step) {
  Impl& m = *impl_;
  if (m.stop_signal.load() != 0) return;
  if (!m.prepared) m.prepare();
  if (m.coord) {
    // The training's time of the next step starts when this call returns (or throws).
    struct Stamp {
      Clock::time_point& at;
      ~Stamp() { at = Clock::now(); }
    } stamp{m.last_after_step};
    m.after_step_distributed(step);
    return;
  }
  if (const int sig = m.signal_pending.load(); sig != 0) {
    m.final_snapshot(step, sig, Clock::now());
    return;
  }
  SnapshotReason reason;
  if (m.schedule.due_at_step(step)) {
    reason = SnapshotReason::kSteps;
  } else if (m.time_due.load(std::memory_order_relaxed)) {
    reason = SnapshotReason::kTime;
  } else if (m.continuous_due()) {
    reason = SnapshotReason::kContinuous;  // the previous one is done: never skipped
  } else {
    return;  // the common case: two atomic loads and a modulo (and a clock read if continuous)
  }
  if (m.last_step == step) return;  // already saved (or resumed from) this step
  const Clock::time_point began = Clock::now();
  m.restart_timer();
  if (m.current.valid() && !m.current.done()) {
    if (m.options.when_busy == WhenBusy::kSkip) {
      int64_t skipped;
      {
        std::lock_guard<std::mutex> lock(m.mu);
        skipped = ++m.stats.skipped;
      }
      m.log("tsnap: " + format::step_name(step) + " skipped (" + to_string(reason) +
            "): " + format::step_name(*m.last_step) + " is still writing; " +
            std::to_string(skipped) + " skipped so far");
      return;
    }
    wait_quietly(m.current);
  }
  m.start_save(step, reason, began);
}

void PeriodicSnapshots::before_optimizer_step() {
  if (impl_->current.valid()) impl_->current.wait_staged();
}

bool PeriodicSnapshots::stop_requested() const { return impl_->stop_signal.load() != 0; }

int PeriodicSnapshots::stop_signal() const { return impl_->stop_signal.load(); }

PeriodicStats PeriodicSnapshots::finish() {
  Impl& m = *impl_;
  if (m.current.valid()) wait_quietly(m.current);
  m.wait_processed();
  // A two-tier Snapshotter: the run's snapshots are in the durable tier too before it ends.
  std::exception_ptr drain_error;
  try {
    m.snapshotter.drain_wait();
  } catch (...) {
    drain_error = std::current_exception();
  }
  PeriodicStats s = stats();
  m.log(policy::summary_line(s));
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    std::swap(error, m.unreported);
  }
  if (error) std::rethrow_exception(error);
  if (drain_error) std::rethrow_exception(drain_error);
  return s;
}

PeriodicStats PeriodicSnapshots::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace tsnap
