// The asynchronous pipeline: point-in-time exactness (eager and lazy), backpressure, saves in
// flight, engine fallback, every failure path through the fault injector, buffer reuse.

#include "tsnap/snapshotter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "io/fault_engine.h"
#include "support/gate_engine.h"
#include "support/on_engine.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"
#include "tsnap/hot_snapshot.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::make_tensor;
using test_support::TempDir;

StateDict big_state(int n, int64_t elems, uint64_t seed) {
  StateDict sd;
  for (int i = 0; i < n; ++i) {
    sd.insert("layer" + std::to_string(i) + ".weight",
              make_tensor(at::kFloat, {elems}, seed + static_cast<uint64_t>(i)));
  }
  return sd;
}

StateDict clone(const StateDict& sd) {
  StateDict out;
  for (const auto& [k, e] : sd) out.insert(k, e.tensor.clone());
  return out;
}

void expect_equal(const StateDict& want, const StateDict& got) {
  ASSERT_EQ(want.keys(), got.keys());
  for (const auto& [k, e] : want) EXPECT_TRUE(bitwise_equal(e.tensor, got.at(k))) << k;
}

// The flat option names of tsnap 0.1 still work for one minor release (deprecated).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST(Snapshotter, DeprecatedFlatOptionNamesStillApply) {
  TempDir dir, durable;
  SnapshotterOptions o;
  o.root = dir.path();
  o.chunk_bytes = 1 << 20;
  o.staging_budget_bytes = 3 << 20;
  o.durable_root = durable.path();
  o.drain_bytes_per_second = 1 << 30;
  Snapshotter snap(o);
  EXPECT_EQ(snap.staging_budget_bytes(), uint64_t{3} << 20);
  EXPECT_EQ(snap.durable_root(), durable.path());
  // The designated-initialiser form of 0.1's README (old names after every other field).
  Snapshotter hot({.root = dir / "hot", .keep_hot = true});
  StateDict sd;
  sd.insert("w", make_tensor(at::kFloat, {16, 16}, 1));
  hot.save_async("s", sd).wait();
  EXPECT_TRUE(static_cast<bool>(hot.hot_snapshot()));
}
#pragma GCC diagnostic pop

TEST(Snapshotter, EagerSaveIsPointInTimeExact) {
  TempDir dir;
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = 1 << 20, .staging = {.budget_bytes = 8 << 20}});
  StateDict sd = big_state(6, 1 << 19, 1);  // 12 MiB > 8 MiB budget
  const StateDict before = clone(sd);
  SaveHandle h = snap.save_async("s", sd, {{"step", 1}});
  for (auto& [k, e] : sd) e.tensor.fill_(-1);  // training moves on at once
  h.wait();
  expect_equal(before, load(dir / "s"));
  EXPECT_GT(h.stats().stall_s, 0);
  EXPECT_GE(h.stats().total_s, h.stats().stall_s);
}

TEST(Snapshotter, LazySaveIsExactOnceStaged) {
  TempDir dir;
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = 1 << 20, .staging = {.budget_bytes = 4 << 20}});
  StateDict sd = big_state(4, 1 << 19, 2);
  const StateDict before = clone(sd);
  SaveHandle h = snap.save_async("s", sd, {}, {.staging = Staging::kLazy});
  h.wait_staged();
  for (auto& [k, e] : sd) e.tensor.fill_(7);
  h.wait();
  expect_equal(before, load(dir / "s"));
}

TEST(Snapshotter, BackpressureWithBudgetSmallerThanSnapshot) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(),
                    .chunk_bytes = 1 << 20,
                    .staging = {.budget_bytes = 2 << 20},
                    .io = {.threads = 2}});
  StateDict sd = big_state(3, 3 << 20, 3);  // 36 MiB through a 2 MiB pool
  SaveHandle h = snap.save_async("s", sd, {}, {.num_shards = 2});
  h.wait();
  expect_equal(sd, load(dir / "s"));
  EXPECT_GT(h.stats().buffer_waits, 0u);
  EXPECT_GT(h.stats().buffers_reused, 0u);
}

TEST(Snapshotter, ManySavesInFlight) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(),
                    .chunk_bytes = 1 << 20,
                    .staging = {.budget_bytes = 4 << 20},
                    .max_in_flight = 3});
  std::vector<SaveHandle> handles;
  std::vector<StateDict> states;
  for (int i = 0; i < 8; ++i) {
    states.push_back(big_state(2, 100000 + i, 10 + i));
    handles.push_back(snap.save_async("s" + std::to_string(i), states.back(), {{"step", i}}));
  }
  std::atomic<int> callbacks{0};
  for (auto& h : handles) h.on_complete([&](std::exception_ptr e) { callbacks += e ? 100 : 1; });
  snap.wait_all();
  for (auto& h : handles) EXPECT_TRUE(h.done());
  EXPECT_EQ(callbacks, 8);
  for (int i = 0; i < 8; ++i) expect_equal(states[i], load(dir / ("s" + std::to_string(i))));
  EXPECT_EQ(latest(dir.path()), dir / "s7");
}

// Two eager saves staged at once from two threads into a pool that holds one of them whole:
// a save that fits holds its writes until staging ends, and only one may at a time, so neither
// waits for buffers the other holds unwritten. Every save commits, with its own bytes. (The
// race is narrow: this runs it ten times; it does not force the interleaving.)
TEST(Snapshotter, ConcurrentEagerSavesIntoAPoolForOneNeverDeadlock) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(),
                    .chunk_bytes = 1 << 20,
                    .staging = {.budget_bytes = 4 << 20},
                    .max_in_flight = 2});
  const StateDict a = big_state(4, (1 << 20) / 4 - 1024, 1);  // 4 chunks: the whole pool
  const StateDict b = big_state(4, (1 << 20) / 4 - 1024, 2);
  for (int round = 0; round < 10; ++round) {
    SaveHandle ha, hb;
    std::thread other([&] { hb = snap.save_async("b" + std::to_string(round), b); });
    ha = snap.save_async("a" + std::to_string(round), a);
    other.join();
    ha.wait();
    hb.wait();
  }
  expect_equal(a, load(dir / "a9"));
  expect_equal(b, load(dir / "b9"));
}

TEST(Snapshotter, DestructionWaitsForSavesInFlight) {
  TempDir dir;
  StateDict sd = big_state(3, 1 << 20, 21);
  std::vector<SaveHandle> handles;
  {
    Snapshotter snap({.root = dir.path(),
                      .chunk_bytes = 1 << 20,
                      .staging = {.budget_bytes = 4 << 20},
                      .max_in_flight = 3});
    for (int i = 0; i < 3; ++i) handles.push_back(snap.save_async("s" + std::to_string(i), sd));
  }  // returns only once every save has committed or failed
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(handles[i].done());
    EXPECT_NO_THROW(handles[i].wait());
    expect_equal(sd, load(dir / ("s" + std::to_string(i))));
  }
}

TEST(Snapshotter, FailFastPolicyRefusesWhenBusy) {
  TempDir dir;
  // The gate holds the first save at its commit (the rename) until opened: no timing involved.
  auto gate = std::make_shared<test_support::GateEngine>();
  Snapshotter snap = test_support::on_engine(gate, [&] {
    return Snapshotter({.root = dir.path(),
                        .chunk_bytes = 1 << 20,
                        .staging = {.budget_bytes = 2 << 20},
                        .max_in_flight = 1,
                        .in_flight = InFlightPolicy::kFailFast});
  });
  StateDict sd = big_state(1, 1000, 1);
  SaveHandle h = snap.save_async("a", sd);
  for (auto& [k, e] : sd) e.tensor.add_(1);
  try {
    snap.save_async("b", sd);  // refused once planned: its plan is kept for the next save
    FAIL() << "expected kBusy";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBusy);
  }
  EXPECT_FALSE(h.done());
  gate->open_gate();
  h.wait();
  for (auto& [k, e] : sd) e.tensor.add_(1);  // the next save takes the values at its call
  EXPECT_NO_THROW(snap.save_async("b", sd).wait());
  expect_equal(sd, load(dir / "b"));
}

// A second save of a name whose first save is still in flight fails at the call, before
// anything of it is staged or written (not after writing everything, at the commit).
TEST(Snapshotter, SameNameInFlightFailsAtTheCall) {
  TempDir dir;
  auto gate = std::make_shared<test_support::GateEngine>();  // holds "a" at its commit
  Snapshotter snap = test_support::on_engine(gate, [&] {
    return Snapshotter(
        {.root = dir.path(), .chunk_bytes = 1 << 20, .staging = {.budget_bytes = 2 << 20}});
  });
  const StateDict first = big_state(2, 1000, 1);
  const StateDict second = big_state(2, 1000, 50);
  SaveHandle h1 = snap.save_async("a", first);
  try {
    snap.save_async("a", second);
    FAIL() << "expected kAlreadyExists";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists);
    EXPECT_NE(std::string(e.what()).find("still in flight"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(h1.done());
  // Only the first save's temporary directory: the refused one made nothing.
  int temporaries = 0;
  for (const std::string& e : test_support::dir_entries(dir.path())) {
    temporaries += e.find(".tmp-") != std::string::npos;
  }
  EXPECT_EQ(temporaries, 1);
  // Another name is not affected.
  SaveHandle hb = snap.save_async("b", second);

  // With overwrite the second save is ordered after the first: the call waits for it.
  std::atomic<bool> returned{false};
  SaveHandle h2;
  std::thread t([&] {
    h2 = snap.save_async("a", second, nlohmann::json::object(), {.overwrite = true});
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(returned.load()) << "the overwrite did not wait for the save in flight";
  gate->open_gate();
  t.join();
  EXPECT_NO_THROW(h1.wait());
  EXPECT_NO_THROW(h2.wait());
  EXPECT_NO_THROW(hb.wait());
  expect_equal(second, load(dir / "a"));  // the later save is the one that stays
}

// Under kFailFast, overwriting a name still in flight is refused (kBusy) instead of waiting.
TEST(Snapshotter, OverwriteOfANameInFlightFailsFastUnderFailFast) {
  TempDir dir;
  auto gate = std::make_shared<test_support::GateEngine>();
  Snapshotter snap = test_support::on_engine(gate, [&] {
    return Snapshotter({.root = dir.path(),
                        .chunk_bytes = 1 << 20,
                        .staging = {.budget_bytes = 2 << 20},
                        .in_flight = InFlightPolicy::kFailFast});
  });
  const StateDict sd = big_state(1, 1000, 3);
  SaveHandle h = snap.save_async("a", sd);
  try {
    snap.save_async("a", sd, nlohmann::json::object(), {.overwrite = true});
    FAIL() << "expected kBusy";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBusy);
  }
  gate->open_gate();
  h.wait();
  EXPECT_NO_THROW(snap.save_async("a", sd, nlohmann::json::object(), {.overwrite = true}).wait());
  expect_equal(sd, load(dir / "a"));
}

class AdmissionTest : public ::testing::TestWithParam<InFlightPolicy> {
 protected:
  // One save in flight at most, under the policy of the test.
  SnapshotterOptions options(const TempDir& dir) const {
    return {.root = dir.path(),
            .chunk_bytes = 1 << 20,
            .staging = {.budget_bytes = 1 << 20},
            .io = {.engine = EngineKind::kPwrite},
            .max_in_flight = 1,
            .in_flight = GetParam()};
  }
};

// wait() returning means a new save is admitted at once (the slot is released before the
// handle completes), under both policies, every time.
TEST_P(AdmissionTest, SaveRightAfterWaitIsAdmitted) {
  TempDir dir;
  Snapshotter snap(options(dir));
  StateDict sd = big_state(1, 256, 2);
  for (int i = 0; i < 300; ++i) {
    ASSERT_NO_THROW(snap.save_async("s" + std::to_string(i), sd).wait()) << "save " << i;
  }
  expect_equal(sd, load(dir / "s299"));
}

// The same from the completion callback: each save's on_complete starts the next one.
TEST_P(AdmissionTest, SaveFromOnCompleteIsAdmitted) {
  TempDir dir;
  Snapshotter snap(options(dir));
  StateDict sd = big_state(1, 256, 3);
  constexpr int kSaves = 300;
  std::mutex mu;
  std::condition_variable cv;
  int completed = 0;
  std::string failure;
  std::function<void(int)> start = [&](int i) {
    try {
      snap.save_async("s" + std::to_string(i), sd).on_complete([&, i](std::exception_ptr e) {
        if (e) {
          std::lock_guard<std::mutex> lock(mu);
          failure = "save " + std::to_string(i) + " failed";
        } else if (i + 1 < kSaves) {
          start(i + 1);  // from the tsnap thread that completed save i
        }
        std::lock_guard<std::mutex> lock(mu);
        ++completed;
        cv.notify_all();
      });
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failure = "save " + std::to_string(i) + " refused: " + e.what();
      completed = kSaves;
      cv.notify_all();
    }
  };
  start(0);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= kSaves || !failure.empty(); });
  }
  snap.wait_all();
  EXPECT_EQ(failure, "");
  EXPECT_EQ(completed, kSaves);
  expect_equal(sd, load(dir / ("s" + std::to_string(kSaves - 1))));
}

INSTANTIATE_TEST_SUITE_P(Policies, AdmissionTest,
                         ::testing::Values(InFlightPolicy::kFailFast, InFlightPolicy::kWait),
                         [](const auto& info) {
                           return info.param == InFlightPolicy::kFailFast ? "FailFast" : "Wait";
                         });

TEST(Snapshotter, FallsBackToPwriteWhereIoUringIsUnavailable) {
  TempDir dir;
  ::setenv("TSNAP_DISABLE_IO_URING", "1", 1);
  Snapshotter snap({.root = dir.path()});
  ::unsetenv("TSNAP_DISABLE_IO_URING");
  EXPECT_EQ(snap.engine_name().rfind("pwrite", 0), 0u) << snap.engine_name();
  StateDict sd = big_state(2, 5000, 4);
  SaveHandle h = snap.save_async("s", sd);
  h.wait();
  EXPECT_EQ(h.stats().engine, "pwrite");
  expect_equal(sd, load(dir / "s"));
  EXPECT_THROW(
      {
        ::setenv("TSNAP_DISABLE_IO_URING", "1", 1);
        try {
          Snapshotter strict({.root = dir.path(), .io = {.engine = EngineKind::kUring}});
        } catch (...) {
          ::unsetenv("TSNAP_DISABLE_IO_URING");
          throw;
        }
      },
      Error);
}

TEST(Snapshotter, FallsBackToBufferedPwriteWhereDirectIoIsRefused) {
  if (!std::filesystem::exists("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  TempDir dir("/dev/shm");
  Snapshotter snap({.root = dir.path()});
  if (snap.engine_name().find("O_DIRECT") != std::string::npos) {
    GTEST_SKIP() << "this kernel's tmpfs accepts O_DIRECT";
  }
  EXPECT_EQ(snap.engine_name(), "pwrite");
  StateDict sd = big_state(2, 5000, 4);
  SaveHandle h = snap.save_async("s", sd);
  h.wait();
  EXPECT_EQ(h.stats().engine, "pwrite");
  EXPECT_FALSE(h.stats().direct);
  expect_equal(sd, load(dir / "s"));
}

TEST(Snapshotter, UsesIoUringWithDirectIoWhereAllowed) {
  TempDir dir;
  Snapshotter snap({.root = dir.path(), .chunk_bytes = 1 << 20});
  if (snap.engine_name() != "io_uring+O_DIRECT") {
    GTEST_SKIP() << "io_uring or O_DIRECT unavailable here: " << snap.engine_name();
  }
  StateDict sd = big_state(3, 333333, 5);  // sizes not multiples of 4096: padded tails
  SaveHandle h = snap.save_async("s", sd, {}, {.num_shards = 2});
  h.wait();
  EXPECT_EQ(h.stats().engine, "io_uring");
  EXPECT_TRUE(h.stats().direct);
  expect_equal(sd, load(dir / "s"));
  EXPECT_TRUE(verify(dir / "s").empty());
}

// Once armed, holds writes until `n` are submitted, then lets them all go (and every later one
// through): a save then holds n staging buffers at once, whatever the speed of its writes.
class HoldWritesEngine final : public io::ForwardingEngine {
 public:
  HoldWritesEngine() : ForwardingEngine(io::make_pwrite_engine(2)) {}
  void arm(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    left_ = n;
  }
  void write(int fd, const void* buf, size_t len, uint64_t offset, int buf_index,
             io::Done done) override {
    std::vector<std::function<void()>> go;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (left_ > 0) {
        held_.push_back([this, fd, buf, len, offset, buf_index, done = std::move(done)]() mutable {
          ForwardingEngine::write(fd, buf, len, offset, buf_index, std::move(done));
        });
        if (--left_ > 0) return;
        go.swap(held_);
      }
    }
    if (go.empty()) {
      ForwardingEngine::write(fd, buf, len, offset, buf_index, std::move(done));
      return;
    }
    for (auto& write : go) write();
  }

 private:
  std::mutex mu_;
  int left_ = 0;
  std::vector<std::function<void()>> held_;
};

TEST(Snapshotter, PoolIsReusedAcrossSaves) {
  TempDir dir;
  // The first save takes all 4 buffers before any write completes (without the hold, fast
  // writes could hand one buffer back and forth, and the second save find others unused).
  auto hold = std::make_shared<HoldWritesEngine>();
  Snapshotter snap = test_support::on_engine(hold, [&] {
    return Snapshotter(
        {.root = dir.path(), .chunk_bytes = 1 << 20, .staging = {.budget_bytes = 4 << 20}});
  });
  StateDict sd = big_state(2, 1 << 20, 6);  // 9 chunks of 1 MiB, 4 buffers (budget / chunk)
  hold->arm(4);
  snap.save_async("a", sd).wait();
  SaveHandle h = snap.save_async("b", sd);
  h.wait();
  EXPECT_EQ(h.stats().buffers_reused, h.stats().chunks);
}

// Each snapshot under `dir` holds the state saved under its name, verifies, and has an id of
// its own.
void expect_saved_with_own_ids(const TempDir& dir,
                               const std::vector<std::pair<std::string, StateDict>>& saved) {
  std::set<std::string> ids;
  for (const auto& [name, state] : saved) {
    expect_equal(state, load(dir / name));
    EXPECT_TRUE(verify(dir / name).empty()) << name;
    ids.insert(read_manifest(dir / name).id);
  }
  EXPECT_EQ(ids.size(), saved.size());
}

// Saves of a state alike reuse the layout planned for the first (plan::Layout::previous),
// with their own tensors and id: each loads as saved (a shard whose header kept another
// save's id is refused), and a state whose shapes change in between is planned anew.
TEST(Snapshotter, SavesOfAStateAlikeAreExactWithTheirOwnIds) {
  TempDir dir;
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = 1 << 20, .staging = {.budget_bytes = 8 << 20}});
  StateDict sd = big_state(5, 100000, 11);
  StateDict other = big_state(4, 70000, 12);
  std::vector<std::pair<std::string, StateDict>> saved;
  for (const std::string name : {"a", "b", "c", "d", "e"}) {
    const StateDict& state = name == "c" ? other : sd;
    snap.save_async(name, state, {}, {.num_shards = 2}).wait();
    saved.emplace_back(name, clone(state));
    for (auto& [k, e] : sd) e.tensor.add_(1);  // training moves on
  }
  expect_saved_with_own_ids(dir, saved);
}

// Saves in flight together: each takes a plan an earlier save handed back, or plans anew when
// none is free, and hands its own back once it completes; every snapshot is exact whichever
// plan it used, with its own id.
TEST(Snapshotter, OverlappingSavesOfAStateAlikeAreExact) {
  TempDir dir;
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = 1 << 20, .staging = {.budget_bytes = 16 << 20}});
  StateDict sd = big_state(5, 100000, 11);
  std::vector<std::pair<std::string, StateDict>> saved;
  std::vector<SaveHandle> handles;
  for (int i = 0; i < 9; ++i) {
    const std::string name = "s" + std::to_string(i);
    handles.push_back(snap.save_async(name, sd, {}, {.num_shards = 2}));
    saved.emplace_back(name, clone(sd));
    for (auto& [k, e] : sd) e.tensor.add_(1);  // the values at the call are saved
    if (i % 3 == 2) handles.back().wait();     // two or three in flight, then none
  }
  for (SaveHandle& h : handles) h.wait();
  expect_saved_with_own_ids(dir, saved);
}

// The names of this process's threads, from /proc (empty where there is none).
std::multiset<std::string> thread_names() {
  std::multiset<std::string> names;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.insert(name);
  }
  return names;
}

// tsnap's threads are named (top -H, ps -L, perf): the io thread and the pipeline's pool.
TEST(Snapshotter, ItsThreadsAreNamed) {
  if (thread_names().empty()) GTEST_SKIP() << "no /proc/self/task here";
  TempDir dir;
  const std::multiset<std::string> before = thread_names();
  {
    Snapshotter snap({.root = dir.path(), .chunk_bytes = 1 << 20});
    snap.save_async("s", big_state(2, 100000, 1)).wait();
    const std::multiset<std::string> during = thread_names();
    EXPECT_GE(during.count("tsnap-io"), before.count("tsnap-io") + 1);
    EXPECT_GE(during.count("tsnap-pipeline"), before.count("tsnap-pipeline") + 1);
  }
  EXPECT_EQ(thread_names().count("tsnap-pipeline"), before.count("tsnap-pipeline"));
}

TEST(Snapshotter, InvalidNamesAndOptions) {
  TempDir dir;
  Snapshotter snap({.root = dir.path()});
  StateDict sd{{"x", at::ones({1})}};
  for (const char* bad : {"", ".", "..", ".hidden", "a/b"}) {
    EXPECT_THROW(snap.save_async(bad, sd), InvalidArgument) << bad;
  }
  EXPECT_THROW(snap.save_async("x", sd, nlohmann::json::array()), InvalidArgument);
  EXPECT_THROW(snap.save_async("x", sd, {}, {.chunk_bytes = 1000}), InvalidArgument);
  EXPECT_THROW(Snapshotter({.root = dir.path(), .chunk_bytes = 5000}), InvalidArgument);
}

// Every failure point of a save: the handle fails with an error naming the cause, earlier
// snapshots are intact, and nothing that looks committed (nor a temporary) is left behind.
struct FaultCase {
  const char* name;
  io::Faults faults;
  ErrorCode code;
};

class SaveFaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(SaveFaultTest, FailedSaveLeavesEarlierSnapshotsIntact) {
  TempDir dir;
  const FaultCase& fc = GetParam();
  auto faulty = std::make_shared<io::FaultInjectingEngine>(io::make_pwrite_engine(2), fc.faults);
  StateDict good = big_state(2, 300000, 7);
  {
    Snapshotter plain({.root = dir.path(), .chunk_bytes = 1 << 20});
    plain.save_async("good", good).wait();
    plain.save_async("victim", good).wait();
  }
  Snapshotter snap = test_support::on_engine(faulty, [&] {
    return Snapshotter({.root = dir.path(), .chunk_bytes = 1 << 20, .io = {.direct_io = false}});
  });
  StateDict next = big_state(2, 300000, 8);
  bool threw = false;
  try {
    snap.save_async("new", next).wait();
  } catch (const Error& e) {
    threw = true;
    EXPECT_EQ(e.code(), fc.code) << e.what();
  }
  // A failing overwrite must keep the old snapshot.
  bool threw_overwrite = false;
  try {
    snap.save_async("victim", next, {}, {.overwrite = true}).wait();
  } catch (const Error&) {
    threw_overwrite = true;
  }
  EXPECT_TRUE(threw) << fc.name;
  expect_equal(good, load(dir / "good"));
  if (threw_overwrite) expect_equal(good, load(dir / "victim"));
  for (const std::string& e : test_support::dir_entries(dir.path())) {
    EXPECT_TRUE(e == "good" || e == "victim" || (e == "new" && !threw)) << "left behind: " << e;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Faults, SaveFaultTest,
    ::testing::Values(FaultCase{"write1", {.fail_write = 1}, ErrorCode::kIo},
                      FaultCase{"write3", {.fail_write = 3}, ErrorCode::kIo},
                      FaultCase{"enospc", {.space_bytes = 600000}, ErrorCode::kNoSpace},
                      FaultCase{"fsync", {.fail_fsync = 1}, ErrorCode::kIo},
                      FaultCase{"manifest_fsync", {.fail_fsync = 2}, ErrorCode::kIo},
                      FaultCase{"rename", {.fail_rename = 1}, ErrorCode::kIo},
                      FaultCase{"open", {.fail_open = 2}, ErrorCode::kIo},
                      FaultCase{"mkdir", {.fail_mkdir = 1}, ErrorCode::kIo},
                      FaultCase{"dirsync", {.fail_fsync_dir = 1}, ErrorCode::kIo}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Snapshotter, ThrowingCopyFailsTheHandle) {
  TempDir dir;
  Snapshotter snap({.root = dir.path()});
  // A meta tensor has no data: staging it throws inside the TBB arena.
  StateDict sd;
  sd.insert("ok", at::ones({10}));
  sd.insert("meta", at::empty({10}, at::TensorOptions().device(at::kMeta)));
  bool failed = false;
  try {
    snap.save_async("s", sd).wait();
  } catch (const std::exception&) {
    failed = true;
  }
  EXPECT_TRUE(failed);
  EXPECT_TRUE(test_support::dir_entries(dir.path()).empty());
}

}  // namespace
}  // namespace tsnap

namespace tsnap {
namespace {

// The default budget is sized at the first save to hold it whole, then fixed: a 1 MB model
// does not pay for 512 MiB of pinned buffers, and a larger later save reuses the same pool.
TEST(SnapshotterBudget, AutomaticBudgetHoldsTheFirstSaveAndStaysFixed) {
  test_support::TempDir dir;
  SnapshotterOptions o;
  o.root = dir.path();
  o.chunk_bytes = 1 << 20;
  Snapshotter snap(o);
  EXPECT_EQ(snap.staging_budget_bytes(), 0u);  // nothing allocated before a save
  StateDict small;
  for (int i = 0; i < 3; ++i) {
    small.insert("w" + std::to_string(i), test_support::make_tensor(at::kFloat, {256 << 10}, i));
  }
  SaveHandle first = snap.save_async("first", small);
  first.wait();
  const uint64_t budget = snap.staging_budget_bytes();
  EXPECT_GE(budget, 3u << 20);
  EXPECT_LE(budget, 8u << 20);
  EXPECT_EQ(first.stats().buffer_waits, 0u);
  StateDict big = small;
  for (int i = 3; i < 12; ++i) {
    big.insert("w" + std::to_string(i), test_support::make_tensor(at::kFloat, {256 << 10}, i));
  }
  SaveHandle second = snap.save_async("second", big);
  second.wait();
  EXPECT_EQ(snap.staging_budget_bytes(), budget);  // fixed after the first save
  // (Whether it waited for buffers depends on write speed against staging speed: not checked.)
  EXPECT_TRUE(test_support::bitwise_equal(load(dir / "second").at("w11"), big.at("w11")));
}

// prepare() makes the pool a first save would make, before it: the save then finds it made
// (and faulted in) and keeps it; a second prepare, or one after a save, changes nothing.
TEST(SnapshotterBudget, PrepareSizesThePoolAsTheFirstSaveWould) {
  test_support::TempDir dir;
  SnapshotterOptions o;
  o.root = dir.path();
  o.chunk_bytes = 1 << 20;
  StateDict state;
  for (int i = 0; i < 3; ++i) {
    state.insert("w" + std::to_string(i), test_support::make_tensor(at::kFloat, {256 << 10}, i));
  }
  uint64_t by_save = 0;
  {
    Snapshotter reference(o);
    reference.save_async("s", state).wait();
    by_save = reference.staging_budget_bytes();
  }
  test_support::TempDir dir2;
  o.root = dir2.path();
  Snapshotter snap(o);
  snap.prepare(state);
  EXPECT_EQ(snap.staging_budget_bytes(), by_save);
  snap.prepare(state);
  SaveHandle h = snap.save_async("after", state);
  h.wait();
  EXPECT_EQ(snap.staging_budget_bytes(), by_save);
  EXPECT_EQ(h.stats().buffer_waits, 0u);
  EXPECT_TRUE(test_support::bitwise_equal(load(dir2 / "after").at("w2"), state.at("w2")));
  // The planning's own checks apply.
  Snapshotter other(o);
  SaveOptions bad;
  bad.chunk_bytes = 2 << 20;
  EXPECT_THROW(other.prepare(state, bad), InvalidArgument);
  EXPECT_EQ(other.staging_budget_bytes(), 0u);
}

}  // namespace
}  // namespace tsnap
