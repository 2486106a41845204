// DistGroup and its coordinator over a c10d Store. Ranks agree on a save by its snapshot name:
// the keys of the n-th save of `name` in run `run` (the group's id, published by rank 0 when
// the group forms) are
//   <prefix>/<run>/<name>#<n>/rank-<r>   rank r's report (its manifest part, or its error)
//   <prefix>/<run>/<name>#<n>/outcome    rank 0's verdict: empty = committed, else the error
//   <prefix>/<run>/<name>#<n>/acks       how many other ranks need nothing more of the save
//   <prefix>/<run>/triggers, trigger-<n>   periodic hooks' snapshot triggers, in posting order
// Rank 0 deletes the reports once read; the verdicts are a few bytes each and stay.

#include "tsnap/dist_group.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/hidden.h"
#include "common/sys_error.h"
#include "dist/coordinator.h"
#include "format/layout.h"
#include "tsnap/error.h"

namespace tsnap {
namespace {

using nlohmann::json;

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string seconds_text(std::chrono::milliseconds t) {
  const auto ms = t.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

class StoreCoordinator final : public dist::Coordinator {
 public:
  StoreCoordinator(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                   DistOptions options)
      : store_(std::move(store)),
        rank_(rank),
        world_size_(world_size),
        options_(std::move(options)) {
    const std::string run_key = options_.prefix + "/run";
    try {
      if (rank_ == 0) store_->set(run_key, bytes_of(format::new_save_id()));
      store_->wait({run_key}, options_.timeout);
      run_ = string_of(store_->get(run_key));
    } catch (const std::exception& e) {
      throw_error(ErrorCode::kPeerFailed,
                  "rank " + std::to_string(rank_) + ": the group did not form within " +
                      seconds_text(options_.timeout) +
                      " (rank 0 must join too): " + detail::first_line(e.what()));
    }
    if (!format::is_temporary(format::temporary_name("x", run_))) {
      throw_error(ErrorCode::kPeerFailed,
                  "the group's id '" + run_ + "' in the store is not tsnap's");
    }
  }

  // Waits until every key of `keys` exists, polling (never a blocking Store::wait, which holds
  // the client's lock for its whole duration in LibTorch 1.13 and 2.x: the periodic hook's
  // trigger polls on the same client would stall behind it). False on timeout; a store
  // failure (its host ended) throws at once.
  bool wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(500);
    while (!store_->check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
    }
    return true;
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  std::string save_id(const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t n = saves_of_[name]++;
    const std::string id = format::group_save_id(run_, name, n);
    // The store keys of a save are its name's, which cannot collide as 32-bit ids could.
    slots_[id] = {name, name + "#" + std::to_string(n), started_++};
    return id;
  }

  void publish(const std::string& id, const std::string& report) override {
    guarded("publish its part of " + describe(id), [&] {
      store_->set(key(id, rank_), bytes_of(report));
      // Which save this rank is at, so that a rank left waiting can tell a rank that saves
      // another snapshot from one that is dead or stuck.
      const Slot s = slot_of(id);
      store_->set(latest_key(rank_), bytes_of(std::to_string(s.sequence) + " " + s.key));
    });
  }

  std::vector<std::string> gather(const std::string& id) override {
    std::vector<std::string> keys;
    for (int r = 0; r < world_size_; ++r) keys.push_back(key(id, r));
    bool all = false;
    guarded("wait for the ranks' parts of " + describe(id),
            [&] { all = wait_for(keys, options_.timeout); });
    if (!all) {
      std::string missing;
      int count = 0;
      for (int r = 0; r < world_size_; ++r) {
        bool there = false;
        try {
          there = store_->check({keys[r]});
        } catch (const std::exception&) {
        }
        if (!there) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          ++count;
        }
      }
      if (const std::optional<Other> other = other_save(id, first_missing(keys))) {
        // Only this rank's save fails: the other rank's save may still meet a later save of
        // this rank (it skipped this one), and when it does not, it learns why from this
        // rank's `latest` key when its wait for the outcome ends.
        throw_error(ErrorCode::kPeerFailed,
                    disagreement(rank_, slot_of(id).name, other->rank, other->name));
      }
      throw_error(ErrorCode::kPeerFailed,
                  std::string(count == 1 ? "rank " : "ranks ") + missing + " did not report on " +
                      describe(id) + " within " + seconds_text(options_.timeout) +
                      " (dead, stuck, or not saving this snapshot: every rank must call "
                      "save_async with the same name)");
    }
    std::vector<std::string> reports;
    guarded("read the ranks' parts of " + describe(id), [&] {
      for (const std::string& k : keys) {
        reports.push_back(string_of(store_->get(k)));
        store_->deleteKey(k);
      }
    });
    return reports;
  }

  void decide(const std::string& id, const std::string& outcome) override {
    guarded("publish the outcome of " + describe(id),
            [&] { store_->set(outcome_key(id), bytes_of(outcome)); });
  }

  void acknowledge(const std::string& id) override {
    guarded("acknowledge " + describe(id), [&] { store_->add(acks_key(id), 1); });
  }

  void await_acknowledgements(const std::string& id, int count) noexcept override {
    if (over_) return;
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    auto pause = std::chrono::microseconds(200);
    try {
      while (store_->add(acks_key(id), 0) < count && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
      }
    } catch (const std::exception&) {
    }
  }

  int reported_others(const std::string& id) noexcept override {
    int n = 0;
    if (over_) return n;
    for (int r = 1; r < world_size_; ++r) {
      try {
        n += store_->check({key(id, r)}) ? 1 : 0;
      } catch (const std::exception&) {
      }
    }
    return n;
  }

  int64_t post_trigger(const std::string& text) override {
    int64_t index = 0;
    guarded("post a snapshot trigger", [&] {
      index = store_->add(options_.prefix + "/" + run_ + "/triggers", 1) - 1;
      store_->set(trigger_key(index), bytes_of(text));
    });
    return index;
  }

  std::string poll_trigger(int64_t index) override {
    std::string out;
    guarded("read the snapshot triggers", [&] {
      const std::string k = trigger_key(index);
      if (store_->check({k})) out = string_of(store_->get(k));
    });
    return out;
  }

  std::string outcome(const std::string& id) override {
    const std::string k = outcome_key(id);
    bool there = false;
    guarded("wait for rank 0's outcome of " + describe(id),
            [&] { there = wait_for({k}, 2 * options_.timeout); });
    if (!there) {
      if (const std::optional<Other> other = other_save(id, 0)) {
        throw_error(ErrorCode::kPeerFailed,
                    disagreement(rank_, slot_of(id).name, other->rank, other->name));
      }
      throw_error(ErrorCode::kPeerFailed,
                  "rank 0 gave no outcome of " + describe(id) + " within " +
                      seconds_text(2 * options_.timeout) +
                      " (dead or stuck; nothing was committed by this rank)");
    }
    std::string out;
    guarded("read the outcome of " + describe(id), [&] { out = string_of(store_->get(k)); });
    return out;
  }

 private:
  // A save of this rank: its snapshot's name, its store slot ("<name>#<n>"), and how many
  // saves this rank started before it.
  struct Slot {
    std::string name;
    std::string key;
    uint64_t sequence = 0;
  };
  Slot slot_of(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = slots_.find(id);
    return it == slots_.end() ? Slot{"", id, 0} : it->second;
  }
  // How messages name save `id`: by its snapshot's name, which the user knows.
  std::string describe(const std::string& id) const {
    const Slot s = slot_of(id);
    if (s.name.empty()) return "save " + id;
    // Agreements that are not saves have names no snapshot can have: "/resume".
    if (s.name.front() == '/') return "the agreement on " + s.name.substr(1);
    return "the save of snapshot '" + s.name + "'";
  }
  // The store prefix of save `id`'s keys.
  std::string slot(const std::string& id) const {
    return options_.prefix + "/" + run_ + "/" + slot_of(id).key;
  }
  std::string latest_key(int r) const {
    return options_.prefix + "/" + run_ + "/latest-rank-" + std::to_string(r);
  }
  // The first rank (of `keys`, one per rank) that has not reported; -1 when none.
  int first_missing(const std::vector<std::string>& keys) {
    for (int r = 0; r < world_size_; ++r) {
      try {
        if (!store_->check({keys[r]})) return r;
      } catch (const std::exception&) {
        return -1;
      }
    }
    return -1;
  }
  // Another rank's save that should have been the same as this rank's save `id`.
  struct Other {
    int rank;
    std::string name;  // its snapshot's name
  };
  // When rank `r` published its part of a save it started as the same one in sequence as
  // save `id` but of another snapshot name, that save; else nullopt (behind, or the same).
  std::optional<Other> other_save(const std::string& id, int r) {
    if (r < 0 || over_) return std::nullopt;
    std::string latest;
    try {
      const std::string k = latest_key(r);
      if (!store_->check({k})) return std::nullopt;
      latest = string_of(store_->get(k));
    } catch (const std::exception&) {
      return std::nullopt;
    }
    const Slot mine = slot_of(id);
    const size_t space = latest.find(' '), hash = latest.rfind('#');
    if (space == std::string::npos || hash == std::string::npos || hash < space ||
        mine.name.empty()) {
      return std::nullopt;
    }
    const std::string name = latest.substr(space + 1, hash - space - 1);
    if (latest.substr(0, space) != std::to_string(mine.sequence) || name == mine.name) {
      return std::nullopt;
    }
    return Other{r, name};
  }
  static std::string disagreement(int rank, const std::string& name, int other_rank,
                                  const std::string& other_name) {
    return "the ranks disagree on the snapshot's name: rank " + std::to_string(rank) + " saves '" +
           name + "' while rank " + std::to_string(other_rank) + " saves '" + other_name +
           "' as the same save in sequence (every rank must call save_async with the same names "
           "in the same order; a rank that skipped a save is in step again at the next name the "
           "ranks share)";
  }
  std::string key(const std::string& id, int r) const {
    return slot(id) + "/rank-" + std::to_string(r);
  }
  std::string trigger_key(int64_t index) const {
    return options_.prefix + "/" + run_ + "/trigger-" + std::to_string(index);
  }
  std::string acks_key(const std::string& id) const { return slot(id) + "/acks"; }
  std::string outcome_key(const std::string& id) const { return slot(id) + "/outcome"; }
  // Store failures (a lost connection: the rank hosting the store died) become kPeerFailed.
  // After the first one the group is over: later calls fail at once without touching the
  // store (each failed call would wait on the dead connection, and LibTorch may print it).
  template <class F>
  void guarded(const std::string& what, F&& f) {
    const auto failure = [&](const std::string& cause) {
      return "rank " + std::to_string(rank_) + " could not " + what +
             " through the store (the rank that hosts it, usually rank 0, may have ended): " +
             cause;
    };
    if (over_) {
      std::lock_guard<std::mutex> lock(mu_);
      throw_error(ErrorCode::kPeerFailed, failure(over_cause_));
    }
    try {
      f();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string cause = detail::first_line(e.what());
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!over_) over_cause_ = cause;
      }
      over_ = true;
      throw_error(ErrorCode::kPeerFailed, failure(cause));
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int world_size_;
  DistOptions options_;
  std::string run_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> saves_of_;  // name -> saves of it started so far
  std::map<std::string, Slot> slots_;         // save id -> its slot
  uint64_t started_ = 0;                      // saves started (save_id calls)
  std::atomic<bool> over_{false};             // a store call failed: the group is over
  std::string over_cause_;                    // the first failure's message (under mu_)
};

int env_int(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    throw_error(ErrorCode::kInvalidArgument,
                std::string("environment variable ") + name + " is not set (set by torchrun)");
  }
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) {
    throw_error(ErrorCode::kInvalidArgument, std::string("environment variable ") + name + "=" + v +
                                                 " is not an integer in [" + std::to_string(lo) +
                                                 ", " + std::to_string(hi) + "]");
  }
  return static_cast<int>(n);
}

}  // namespace

struct TSNAP_HIDDEN DistGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
};

DistGroup::DistGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                     DistOptions options)
    : rank_(rank), world_size_(world_size), impl_(std::make_unique<Impl>()) {
  if (!store) throw_error(ErrorCode::kInvalidArgument, "DistGroup needs a store");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw_error(
        ErrorCode::kInvalidArgument,
        "rank " + std::to_string(rank) + " is not in a group of " + std::to_string(world_size));
  }
  if (options.timeout.count() <= 0) {
    throw_error(ErrorCode::kInvalidArgument, "DistOptions::timeout must be positive");
  }
  impl_->store = store;
  coordinator_ =
      std::make_shared<StoreCoordinator>(std::move(store), rank, world_size, std::move(options));
}

DistGroup::~DistGroup() = default;

const c10::intrusive_ptr<c10d::Store>& DistGroup::store() const { return impl_->store; }

std::shared_ptr<DistGroup> DistGroup::from_env(DistOptions options) {
  const int world = env_int("WORLD_SIZE", 1, 1 << 20);
  const int rank = env_int("RANK", 0, world - 1);
  const int port = env_int("MASTER_PORT", 1, 65535);
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') {
    throw_error(ErrorCode::kInvalidArgument,
                "environment variable MASTER_ADDR is not set (set by torchrun)");
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = rank == 0;
  o.numWorkers = static_cast<size_t>(world);
  o.waitWorkers = true;
  o.timeout = options.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(addr, o);
  } catch (const std::exception& e) {
    throw_error(ErrorCode::kPeerFailed,
                "rank " + std::to_string(rank) + " could not reach the store at " + addr + ":" +
                    std::to_string(port) + ": " + detail::first_line(e.what()));
  }
  return std::make_shared<DistGroup>(std::move(store), rank, world, std::move(options));
}

}  // namespace tsnap
