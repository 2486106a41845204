// Distributed saves (label `dist`): each test spawns its ranks as processes of this program
// (exec, so no thread state crosses a fork) on 127.0.0.1 with a free port; the ranks form a
// DistGroup over a TCPStore (and a Gloo process group for the training's own collectives),
// save, and write their outcome to a file; the parent checks the snapshot and the outcomes.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "dist/run_ranks.h"
#include "io/fault_engine.h"
#include "support/on_engine.h"
#include "support/s3_server.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/checkpoint.h"
#include "tsnap/dist_group.h"
#include "tsnap/error.h"
#include "tsnap/hot_snapshot.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/periodic_snapshots.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::make_tensor;
using test_support::Ranks;
using test_support::run_ranks;
using test_support::TempDir;

// --- What every rank holds ------------------------------------------------------------------

// The same replicated tensors on every rank (a data-parallel model), of uneven sizes.
StateDict replicated_state() {
  StateDict sd;
  const int64_t sizes[] = {300000, 200000, 150000, 100000, 64000, 10000, 1000, 3};
  for (int i = 0; i < 8; ++i) {
    sd.insert("rep." + std::to_string(i), make_tensor(at::kFloat, {sizes[i]}, 100 + i));
  }
  sd.insert("rep.steps", make_tensor(at::kLong, {5}, 99));
  return sd;
}

// The global tensors that sharded saves cut into pieces.
std::map<std::string, at::Tensor> globals() {
  return {{"sh.rows", make_tensor(at::kFloat, {37, 16}, 7)},
          {"sh.cols", make_tensor(at::kFloat, {8, 10}, 8)},
          {"sh.vec", make_tensor(at::kDouble, {5}, 9)}};
}

// [begin, end) of piece `rank` of `n` along a dimension of `size` (sizes differ by at most 1).
std::pair<int64_t, int64_t> split(int64_t size, int rank, int n) {
  const int64_t base = size / n, extra = size % n;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

// Rank `rank` of `n`'s pieces of the globals: rows and vec along dim 0, cols along dim 1.
StateDict pieces(int rank, int n, bool zeros = false) {
  StateDict sd;
  for (const auto& [key, g] : globals()) {
    const int64_t dim = key == "sh.cols" ? 1 : 0;
    const auto [b, e] = split(g.size(dim), rank, n);
    at::Tensor piece = g.narrow(dim, b, e - b).contiguous();
    if (zeros) piece = at::zeros_like(piece);
    std::vector<int64_t> offsets(static_cast<size_t>(g.dim()), 0);
    offsets[static_cast<size_t>(dim)] = b;
    sd.insert(key, piece, {}, ShardSpec{g.sizes().vec(), offsets});
  }
  return sd;
}

// Step `step` of an incremental chain: the pieces and most replicated tensors never change;
// "rep.7" and "rep.steps" do.
StateDict incremental_state(int rank, int world, int step) {
  StateDict sd = pieces(rank, world);
  for (auto& [key, entry] : replicated_state()) sd.insert(key, entry.tensor);
  sd.set("rep.7", make_tensor(at::kFloat, {3}, 107) + step);
  sd.set("rep.steps", at::full({5}, step, at::kLong));
  return sd;
}

// --- The ranks ---------------------------------------------------------------------------------

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// What a rank reports to the parent: "ok", or "error <code> <message>".
void report(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }

// How many times `part` occurs in `text`.
int occurrences(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

std::string outcome_of(SaveHandle& h) {
  try {
    h.wait();
    return "ok";
  } catch (const Error& e) {
    return "error " + std::to_string(static_cast<int>(e.code())) + " " + e.what();
  }
}

// Saves s1..s<steps> of the incremental chain, each waited for: "" when every one is ok, else
// the first outcome that is not. `last` gets the last save's handle.
std::string save_chain(Snapshotter& snap, int rank, int world, int steps, SaveHandle* last) {
  for (int step = 1; step <= steps; ++step) {
    SaveHandle h =
        snap.save_async("s" + std::to_string(step), incremental_state(rank, world, step));
    const std::string outcome = outcome_of(h);
    if (outcome != "ok") return outcome;
    *last = h;
  }
  return "";
}

#ifdef USE_C10D_GLOO
// The training's own collectives: an all-reduce on a Gloo group over the same store.
double all_reduce_sum(const std::shared_ptr<DistGroup>& group, double value) {
  static c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  if (!pg) {
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("train", group->store()), group->rank(),
        group->world_size(), options);
  }
  std::vector<at::Tensor> t{at::full({1}, value, at::kDouble)};
  pg->allreduce(t)->wait();
  return t[0].item<double>();
}
#endif

void run_rank() {
  const std::string scenario = env("TSNAP_DIST_SCENARIO");
  const fs::path root = env("TSNAP_DIST_ROOT");
  const fs::path out = root.parent_path() / ("rank-" + std::string(env("RANK")) + ".txt");
  DistOptions dopt;
  dopt.timeout = std::chrono::milliseconds(std::atoi(env("TSNAP_DIST_TIMEOUT_MS")));
  std::shared_ptr<DistGroup> group = DistGroup::from_env(dopt);
  const int rank = group->rank(), world = group->world_size();
  SnapshotterOptions o;
  o.root = root;
  o.staging.budget_bytes = 8 << 20;
  o.chunk_bytes = 256 << 10;
  o.group = group;

  if (scenario == "replicated" || scenario == "sharded") {
    Snapshotter snap(o);
    StateDict sd = scenario == "replicated" ? replicated_state() : pieces(rank, world);
    if (scenario == "sharded") {
      for (auto& [key, entry] : replicated_state()) sd.insert(key, entry.tensor);
    }
    SaveHandle h = snap.save_async("snap", sd, {{"step", 7}});
    std::string text = outcome_of(h);
#ifdef USE_C10D_GLOO
    // Collectives of the training right after save_async: the save coordinates through the
    // store on tsnap's threads, so neither waits for the other.
    const double sum = all_reduce_sum(group, rank + 1.0);
    if (sum != world * (world + 1) / 2.0) text = "error all_reduce gave " + std::to_string(sum);
#endif
    report(out, text);
  } else if (scenario == "incremental") {
    o.incremental = true;
    Snapshotter snap(o);
    SaveHandle last;
    std::string text = save_chain(snap, rank, world, 3, &last);
    if (text.empty()) text = "ok " + std::to_string(last.stats().linked_bytes);
    report(out, text);
  } else if (scenario == "tier" || scenario == "s3tier") {
    // Two tiers across ranks: rank 0 drains the shared snapshots to the durable root (a
    // directory, incremental saves; or object storage, where every rank's files are uploaded).
    o.incremental = scenario == "tier";
    o.tier.durable_root = scenario == "tier" ? (root.parent_path() / "durable").string()
                                             : std::string(std::getenv("TSNAP_TEST_S3_DURABLE"));
    o.tier.local_keep_last = 0;
    Snapshotter snap(o);
    SaveHandle last;
    std::string text = save_chain(snap, rank, world, 2, &last);
    if (text.empty()) {
      snap.drain_wait();
      text = "ok " + std::to_string(snap.drain_stats().drained);
    }
    report(out, text);
  } else if (scenario == "hot") {
    // keep_hot across ranks (incremental too): each rank's image holds its pieces and every
    // replicated entry, those other ranks wrote included.
    o.staging.keep_hot = true;
    o.incremental = true;
    Snapshotter snap(o);
    SaveHandle last;
    std::string text = save_chain(snap, rank, world, 2, &last);
    if (text.empty()) {
      const StateDict want = incremental_state(rank, world, 2);
      auto zeros = [&] {
        StateDict sd;
        for (const auto& [key, e] : want) sd.insert(key, at::zeros_like(e.tensor), {}, e.shard);
        return sd;
      };
      StateDict from_memory = zeros(), from_disk = zeros();
      try {
        const HotSnapshot hot = snap.hot_snapshot();
        load_into(hot, from_memory);
        load_into(root / "s2", from_disk);
        bool same = hot.name() == "s2";
        for (const auto& [key, e] : want) {
          same = same && bitwise_equal(from_memory.at(key), e.tensor) &&
                 bitwise_equal(from_disk.at(key), e.tensor);
        }
        size_t memory_files = 0;
        for (const FileRecord& f : hot.manifest().files) {
          if (f.name.rfind("memory-r" + std::to_string(rank) + "-", 0) != 0) continue;
          ++memory_files;
          if (fs::exists(root / "s2" / f.name)) same = false;
        }
        // load gives this rank's state as it saved it: its pieces (with their ShardSpecs)
        // and every replicated entry.
        const StateDict mine = load(hot);
        bool as_saved = mine.size() == want.size();
        for (const auto& [key, e] : want) {
          as_saved = as_saved && mine.contains(key) && bitwise_equal(mine.at(key), e.tensor) &&
                     mine.entry(key).shard == e.shard;
        }
        text = std::string(same ? "ok" : "DIFFERENT") + " memory-files " +
               (memory_files > 0 ? "some" : "none") + " load " +
               (as_saved ? "as-saved" : "DIFFERENT");
      } catch (const Error& e) {
        text = "error " + std::to_string(static_cast<int>(e.code())) + " " + e.what();
      }
    }
    report(out, text);
  } else if (scenario == "killed") {
    Snapshotter snap(o);
    SaveHandle first = snap.save_async("first", replicated_state());
    std::string text = outcome_of(first);
    if (text == "ok") {
      SaveHandle h = snap.save_async("second", replicated_state());
      if (rank == 1) ::raise(SIGKILL);  // dies with its writes in flight
      text = outcome_of(h);
    }
    report(out, text);
  } else if (scenario == "host_killed") {
    // Rank 0, which hosts the store, dies mid-save: the others fail at once, saying why.
    Snapshotter snap(o);
    SaveHandle first = snap.save_async("first", replicated_state());
    std::string text = outcome_of(first);
    if (text == "ok") {
      SaveHandle h = snap.save_async("second", replicated_state());
      if (rank == 0) ::raise(SIGKILL);
      const auto t0 = std::chrono::steady_clock::now();
      text = outcome_of(h);
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      text += took < 10 ? " FAST" : " SLOW";
    }
    report(out, text);
  } else if (scenario == "write_fails") {
    io::Faults faults;
    faults.fail_write = rank == 1 ? 2 : 0;
    auto engine = std::make_shared<io::FaultInjectingEngine>(io::make_pwrite_engine(2), faults);
    Snapshotter snap = test_support::on_engine(engine, [&] { return Snapshotter(o); });
    SaveHandle h = snap.save_async("snap", replicated_state());
    report(out, outcome_of(h));
  } else if (scenario == "keys_differ") {
    Snapshotter snap(o);
    StateDict sd = replicated_state();
    if (rank == 1) sd.insert("rep.extra", make_tensor(at::kFloat, {10}, 5));
    SaveHandle h = snap.save_async("snap", sd);
    report(out, outcome_of(h));
  } else if (scenario == "skipped") {
    // The last rank never calls save_async("bad"); the others' "bad" fails, and the saves after
    // it succeed on every rank (ranks agree on a save by its name, not by a count).
    Snapshotter snap(o);
    std::string text;
    if (rank != world - 1) {
      SaveHandle bad = snap.save_async("bad", replicated_state());
      const std::string got = outcome_of(bad);
      const std::string peer_failed =
          "error " + std::to_string(static_cast<int>(ErrorCode::kPeerFailed)) + " ";
      text = got.rfind(peer_failed, 0) == 0 ? "bad-failed" : "bad: " + got;
    } else {
      text = "bad-skipped";
    }
    for (const char* name : {"after", "after2", "after3"}) {
      SaveHandle h = snap.save_async(name, replicated_state());
      text += std::string(" ") + name + "=" + outcome_of(h);
    }
    report(out, text);
  } else if (scenario == "dtype_differs") {
    Snapshotter snap(o);
    StateDict sd = replicated_state();
    sd.insert("rep.big4", make_tensor(rank == 1 ? at::kDouble : at::kFloat, {64, 64}, 5));
    SaveHandle h = snap.save_async("snap", sd);
    report(out, outcome_of(h));
  } else if (scenario == "store_gone") {
    // Rank 0 hosts the store and ends at step 20 without a word; rank 1 trains on with
    // periodic snapshots: one log line says the group has ended, and it exits cleanly.
    Snapshotter snap(o);
    StateDict sd;
    sd.insert("w", make_tensor(at::kFloat, {1000}, 0));
    std::vector<std::string> lines;
    std::mutex lines_mu;
    PeriodicOptions popt;
    popt.log = [&](const std::string& line) {
      std::lock_guard<std::mutex> lock(lines_mu);
      lines.push_back(line);
    };
    std::string text;
    {
      PeriodicSnapshots hook(
          snap, Schedule({.every_steps = 5, .every_seconds = 0.05}),
          [&] {
            return Checkpoint::of({{"state", sd}});
          },
          popt);
      for (int64_t step = 1; step <= 80; ++step) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (rank == 0 && step == 20) std::_Exit(0);
        hook.after_step(step);
      }
      try {
        hook.finish();
        text = "finished";
      } catch (const Error& e) {
        text = "finished-with " + std::to_string(static_cast<int>(e.code()));
      }
    }
    int ended = 0, backtraces = 0;
    for (const std::string& line : lines) {
      ended += line.find("store cannot be reached") != std::string::npos;
      backtraces +=
          line.find("frame #") != std::string::npos || line.find('\n') != std::string::npos;
    }
    report(out, text + " ended-lines " + std::to_string(ended) + " backtraces " +
                    std::to_string(backtraces));
  } else if (scenario == "bad_piece") {
    // Rank 1's own piece lies outside its global shape: its save_async refuses it; rank 0 is
    // told that rank 1 failed, and why.
    Snapshotter snap(o);
    StateDict sd;
    sd.insert("sh", make_tensor(at::kFloat, {4, 3}, 1), {},
              ShardSpec{{8, 3}, {rank == 1 ? 6 : 0, 0}});
    std::string text;
    try {
      SaveHandle h = snap.save_async("snap", sd);
      text = outcome_of(h);
    } catch (const Error& e) {
      text = "error " + std::to_string(static_cast<int>(e.code())) + " " + e.what();
    }
    report(out, text);
  } else if (scenario == "name_differs") {
    // Rank 1 saves under another name: both are told the ranks disagree on the name.
    Snapshotter snap(o);
    SaveHandle h = snap.save_async(rank == 0 ? "a" : "b", replicated_state());
    report(out, outcome_of(h));
    // Rank 0 hosts the store: it stays until rank 1 has its outcome, as a training loop would.
    if (rank == 0) {
      while (group->store()->add("test/done", 0) < 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } else {
      group->store()->add("test/done", 1);
    }
  } else if (scenario == "pieces_overlap") {
    // Rank 0 claims rows [0, 4) of a global tensor, rank 1 rows [2, 6).
    Snapshotter snap(o);
    StateDict sd;
    sd.insert("sh", make_tensor(at::kFloat, {4, 3}, 1), {}, ShardSpec{{8, 3}, {2 * rank, 0}});
    SaveHandle h = snap.save_async("snap", sd);
    report(out, outcome_of(h));
  } else if (scenario == "periodic") {
#ifdef USE_C10D_GLOO
    // A training loop in lockstep (an all-reduce per step, as data parallel training has):
    // snapshots every 4 steps and every 0.15 s (rank 0's clock), retention keeps 2, and a
    // SIGUSR1 on rank 1 alone at step 30 stops both ranks after one final snapshot.
    Snapshotter snap(o);
    StateDict sd;
    sd.insert("w", make_tensor(at::kFloat, {1000}, 0));
    PeriodicSnapshots hook(
        snap,
        Schedule(
            {.every_steps = 4, .every_seconds = 0.15, .on_signals = {SIGUSR1}, .keep_last = 2}),
        [&] {
          return Checkpoint::of({{"state", sd}});
        },
        {.log = nullptr});
    int64_t step = 0;
    while (step < 400 && !hook.stop_requested()) {
      all_reduce_sum(group, 1.0);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ++step;
      sd.set("w", make_tensor(at::kFloat, {1000}, static_cast<uint64_t>(step)));
      if (rank == 1 && step == 30) ::raise(SIGUSR1);
      hook.after_step(step);
    }
    const PeriodicStats stats = hook.finish();
    std::string names;
    for (const SnapshotRecord& r : stats.snapshots) names += " " + r.name;
    report(out, "stop " + std::to_string(step) + " signal " + std::to_string(hook.stop_signal()) +
                    " failed " + std::to_string(stats.failed) + " snapshots" + names);
#else
    report(out, "error built without Gloo");
#endif
  } else if (scenario == "late-signal") {
    // No collectives in lockstep: rank 0 runs far ahead of rank 1, whose SIGUSR1 trigger names a
    // step rank 0 has passed. Both ranks stop, and the final snapshot fails on both.
    Snapshotter snap(o);
    StateDict sd;
    sd.insert("w", make_tensor(at::kFloat, {1000}, 0));
    PeriodicSnapshots hook(snap, Schedule({.on_signals = {SIGUSR1}}),
                           [&] {
                             return Checkpoint::of({{"state", sd}});
                           },
                           {.log = nullptr});
    const auto began = std::chrono::steady_clock::now();
    int64_t step = 0;
    std::string threw = "nothing";
    try {
      while (!hook.stop_requested() &&
             std::chrono::steady_clock::now() - began < std::chrono::seconds(20)) {
        std::this_thread::sleep_for(std::chrono::microseconds(rank == 0 ? 100 : 5000));
        ++step;
        if (rank == 1 && step == 30) ::raise(SIGUSR1);
        hook.after_step(step);
      }
    } catch (const Error& e) {
      threw = std::to_string(static_cast<int>(e.code()));
    }
    report(out, "signal " + std::to_string(hook.stop_signal()) + " threw " + threw +
                    (rank == 0 ? (step > 200 ? " ahead" : " not-ahead") : ""));
    // Rank 0 serves the group's store: it stays until rank 1 has reported.
    const fs::path other = root.parent_path() / "rank-1.txt";
    while (rank == 0 && !fs::exists(other) &&
           std::chrono::steady_clock::now() - began < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } else if (scenario == "resume") {
    Snapshotter snap(o);
    StateDict sd;
    sd.insert("w", at::zeros({1000}, at::kFloat));
    PeriodicSnapshots hook(snap, Schedule({.every_steps = 4}),
                           [&] {
                             return Checkpoint::of({{"state", sd}});
                           },
                           {.log = nullptr});
    const int64_t step = hook.resume([&](Checkpoint& c) { c.apply({{"state", sd}}); });
    const bool same =
        bitwise_equal(sd.at("w"), make_tensor(at::kFloat, {1000}, static_cast<uint64_t>(step)));
    report(out, "resumed " + std::to_string(step) + (same ? " equal" : " DIFFERENT"));
  } else {
    report(out, "error unknown scenario " + scenario);
  }
}

TEST(DistRank, Run) {
  if (std::getenv("TSNAP_DIST_SCENARIO") == nullptr) GTEST_SKIP() << "runs only as a rank";
  try {
    run_rank();
  } catch (const std::exception& e) {
    const fs::path root = env("TSNAP_DIST_ROOT");
    report(root.parent_path() / ("rank-" + std::string(env("RANK")) + ".txt"),
           std::string("error thrown ") + e.what());
  }
  std::_Exit(0);  // skip static destructors (the Gloo group's threads)
}

// --- The parent --------------------------------------------------------------------------------

bool has_temporaries(const fs::path& root) {
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.path().filename().string().rfind('.', 0) == 0 &&
        e.path().filename().string().find(".tmp-") != std::string::npos) {
      return true;
    }
  }
  return false;
}

class DistSave : public ::testing::TestWithParam<int> {};

TEST_P(DistSave, ReplicatedTensorsAreWrittenOnceAndBalanced) {
  const int world = GetParam();
  TempDir dir;
  const Ranks ranks = run_ranks("replicated", world, dir.path(), 20000);
  for (int r = 0; r < world; ++r) EXPECT_EQ(ranks.texts[r], "ok") << "rank " << r;

  const fs::path snap = dir / "root" / "snap";
  const Manifest m = read_manifest(snap);
  EXPECT_EQ(m.world_size, world);
  const StateDict expected = replicated_state();
  EXPECT_EQ(m.tensors.size(), expected.size());  // each key once
  std::vector<uint64_t> bytes(static_cast<size_t>(world), 0);
  for (const TensorRecord& t : m.tensors) {
    EXPECT_FALSE(t.shard.has_value()) << t.name;
    bytes[static_cast<size_t>(m.find_file(t.file)->rank)] += t.nbytes();
  }
  // Greedy by size: no rank holds more than the lightest one plus the largest tensor.
  const uint64_t largest = 300000 * 4;
  EXPECT_LE(*std::max_element(bytes.begin(), bytes.end()),
            *std::min_element(bytes.begin(), bytes.end()) + largest);
  for (int r = 0; r < world; ++r) EXPECT_GT(bytes[r], 0u) << "rank " << r << " wrote nothing";
  EXPECT_EQ(m.metadata.value("step", 0), 7);

  const StateDict back = load(snap);
  for (const auto& [key, entry] : expected) {
    EXPECT_TRUE(bitwise_equal(back.at(key), entry.tensor)) << key;
  }
  EXPECT_TRUE(verify(snap).empty());
  EXPECT_FALSE(has_temporaries(dir / "root"));
}

INSTANTIATE_TEST_SUITE_P(Ranks, DistSave, ::testing::Values(2, 4));

TEST(DistSave, ShardedOnFourRestoresOnTwoAndOne) {
  TempDir dir;
  const Ranks ranks = run_ranks("sharded", 4, dir.path(), 20000);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ranks.texts[r], "ok") << "rank " << r;
  const fs::path snap = dir / "root" / "snap";
  const Manifest m = read_manifest(snap);
  EXPECT_EQ(m.world_size, 4);
  EXPECT_EQ(m.pieces("sh.rows").size(), 4u);
  EXPECT_EQ(m.pieces("sh.vec").size(), 4u);

  // One process: each sharded key comes back whole.
  const StateDict one = load(snap);
  for (const auto& [key, g] : globals()) {
    EXPECT_TRUE(bitwise_equal(one.at(key), g)) << key;
    EXPECT_FALSE(one.entry(key).shard.has_value()) << key;
  }
  for (const auto& [key, entry] : replicated_state()) {
    EXPECT_TRUE(bitwise_equal(one.at(key), entry.tensor)) << key;
  }
  // Two processes: each asks for its half, cut differently from how it was saved.
  for (int r = 0; r < 2; ++r) {
    StateDict dest = pieces(r, 2, /*zeros=*/true);
    const LoadReport report = load_into(snap, dest);
    EXPECT_EQ(report.loaded.size(), 3u);
    const StateDict want = pieces(r, 2);
    for (const auto& [key, entry] : want) {
      EXPECT_TRUE(bitwise_equal(dest.at(key), entry.tensor)) << key << " rank " << r;
    }
  }
  // A replicated tensor can be loaded as a piece too.
  StateDict part;
  part.insert("rep.0", at::zeros({1000}, at::kFloat), {}, ShardSpec{{300000}, {5000}});
  load_into(snap, part);
  EXPECT_TRUE(
      bitwise_equal(part.at("rep.0"), replicated_state().at("rep.0").narrow(0, 5000, 1000)));
  // A piece that reaches outside the global tensor is refused, naming the key.
  StateDict bad;
  bad.insert("sh.vec", at::zeros({3}, at::kDouble), {}, ShardSpec{{5}, {4}});
  EXPECT_THROW(load_into(snap, bad), InvalidArgument);
}

// Incremental saves across ranks: every rank keeps the files it wrote of the previous
// snapshot (replicated ones by the rank the manifest names), so each snapshot of the chain is
// whole and the unchanged files are links.
TEST(DistSave, IncrementalChainReusesEachRanksFilesAndLoadsWhole) {
  TempDir dir;
  const Ranks ranks = run_ranks("incremental", 2, dir.path(), 20000);
  uint64_t linked = 0;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ranks.texts[r].rfind("ok ", 0), 0u) << "rank " << r << ": " << ranks.texts[r];
    linked += std::stoull(ranks.texts[r].substr(3));
  }
  EXPECT_GT(linked, 1000000u);  // rep.0 .. rep.6 and the pieces: 5.3 MB of 5.4
  for (int step = 1; step <= 3; ++step) {
    const fs::path snap = dir / "root" / ("s" + std::to_string(step));
    EXPECT_TRUE(verify(snap).empty()) << snap;
    const StateDict one = load(snap);
    for (const auto& [key, g] : globals()) EXPECT_TRUE(bitwise_equal(one.at(key), g)) << key;
    for (const auto& [key, entry] : incremental_state(0, 2, step)) {
      if (!entry.shard) EXPECT_TRUE(bitwise_equal(one.at(key), entry.tensor)) << key << step;
    }
  }
  const Manifest m3 = read_manifest(dir / "root" / "s3");
  EXPECT_EQ(m3.format_version, kFormatVersion);
  std::set<int> reusing_ranks;
  for (const FileRecord& f : m3.files) {
    if (f.reused_from == "s2") reusing_ranks.insert(f.rank);
  }
  EXPECT_EQ(reusing_ranks, (std::set<int>{0, 1}));
}

// A durable tier across ranks: rank 0 drains each snapshot (every rank's files) and links the
// files the incremental save reused from the durable copy of the previous snapshot.
TEST(DistSave, DurableTierIsDrainedByRankZero) {
  TempDir dir;
  const Ranks ranks = run_ranks("tier", 2, dir.path(), 20000);
  EXPECT_EQ(ranks.texts[0], "ok 2");
  EXPECT_EQ(ranks.texts[1], "ok 0");
  for (int step = 1; step <= 2; ++step) {
    const fs::path snap = dir / "durable" / ("s" + std::to_string(step));
    ASSERT_TRUE(verify(snap).empty()) << snap;
    const StateDict one = load(snap);
    for (const auto& [key, g] : globals()) EXPECT_TRUE(bitwise_equal(one.at(key), g)) << key;
    for (const auto& [key, entry] : incremental_state(0, 2, step)) {
      if (!entry.shard) EXPECT_TRUE(bitwise_equal(one.at(key), entry.tensor)) << key << step;
    }
  }
  int linked = 0;
  for (const FileRecord& f : read_manifest(dir / "durable" / "s2").files) {
    struct stat st {};
    ASSERT_EQ(::stat((dir / "durable" / "s2" / f.name).c_str(), &st), 0);
    if (!f.reused_from.empty() && st.st_nlink >= 2) ++linked;
  }
  EXPECT_GT(linked, 0);
}

// Object storage as the durable tier across ranks: rank 0 uploads the snapshots (every rank's
// files), and one process restores them from the store (another world size), bit for bit.
TEST(DistSave, ObjectStoreTierIsDrainedByRankZeroAndRestoresOnOneProcess) {
  test_support::S3Server& s3 = test_support::S3Server::shared();
  if (!s3.available()) GTEST_SKIP() << s3.why();
  s3.export_environment();
  const std::string bucket = "tsnap-dist-" + std::to_string(::getpid());
  io::S3Client(s3.config()).create_bucket(bucket);
  const std::string durable = "s3://" + bucket + "/run";
  ::setenv("TSNAP_TEST_S3_DURABLE", durable.c_str(), 1);
  TempDir dir;
  const Ranks ranks = run_ranks("s3tier", 2, dir.path(), 20000);
  EXPECT_EQ(ranks.texts[0], "ok 2");
  EXPECT_EQ(ranks.texts[1], "ok 0");
  for (int step = 1; step <= 2; ++step) {
    const std::string snap = durable + "/s" + std::to_string(step);
    EXPECT_EQ(read_manifest(snap).world_size, 2);
    ASSERT_TRUE(verify(snap).empty()) << snap;
    const StateDict one = load(snap);
    for (const auto& [key, g] : globals()) EXPECT_TRUE(bitwise_equal(one.at(key), g)) << key;
    for (const auto& [key, entry] : incremental_state(0, 2, step)) {
      if (!entry.shard) EXPECT_TRUE(bitwise_equal(one.at(key), entry.tensor)) << key << step;
    }
  }
}

// Hot restore with a group: every rank rolls back from memory alone, bit for bit what the
// directory gives, and the replicated entries other ranks wrote come from its own staging.
TEST(DistSave, HotSnapshotOnEveryRankHoldsAllItRestores) {
  TempDir dir;
  const Ranks ranks = run_ranks("hot", 2, dir.path(), 20000);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks.texts[r], "ok memory-files some load as-saved") << "rank " << r;
  }
  EXPECT_TRUE(verify(dir / "root" / "s2").empty());
  for (const auto& e : fs::directory_iterator(dir / "root" / "s2")) {
    EXPECT_NE(e.path().filename().string().rfind("memory-", 0), 0u) << e.path();
  }
}

TEST(DistSave, KilledRankFailsTheSaveOnEveryRankWithinTheTimeout) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  const Ranks ranks = run_ranks("killed", 3, dir.path(), 3000);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(WIFSIGNALED(ranks.statuses[1]));
  for (int r : {0, 2}) {
    EXPECT_EQ(ranks.texts[r].rfind(
                  "error " + std::to_string(static_cast<int>(ErrorCode::kPeerFailed)), 0),
              0u)
        << "rank " << r << ": " << ranks.texts[r];
    EXPECT_NE(ranks.texts[r].find("rank 1"), std::string::npos) << ranks.texts[r];
  }
  EXPECT_LT(took, 30.0);
  EXPECT_FALSE(fs::exists(dir / "root" / "second"));
  const StateDict first = load(dir / "root" / "first");
  EXPECT_TRUE(bitwise_equal(first.at("rep.0"), replicated_state().at("rep.0")));
  EXPECT_FALSE(has_temporaries(dir / "root"));
}

TEST(DistSave, KilledStoreHostFailsTheOthersAtOnceSayingWhy) {
  TempDir dir;
  const Ranks ranks = run_ranks("host_killed", 3, dir.path(), 20000);
  EXPECT_TRUE(WIFSIGNALED(ranks.statuses[0]));
  for (int r : {1, 2}) {
    const std::string& text = ranks.texts[r];
    EXPECT_EQ(text.rfind("error " + std::to_string(static_cast<int>(ErrorCode::kPeerFailed)), 0),
              0u)
        << "rank " << r << ": " << text;
    EXPECT_NE(text.find("through the store"), std::string::npos) << text;
    EXPECT_EQ(text.find("within"), std::string::npos) << "not a timeout: " << text;
    EXPECT_EQ(text.find("frame #"), std::string::npos) << "no backtrace: " << text;
    EXPECT_LE(occurrences(ranks.errs[r], "frame #0:"), 1) << "stderr: " << ranks.errs[r];
    EXPECT_NE(text.find(" FAST"), std::string::npos) << text;
  }
  EXPECT_FALSE(fs::exists(dir / "root" / "second"));
}

TEST(DistSave, FailedWriteOnOneRankFailsEveryRank) {
  TempDir dir;
  const Ranks ranks = run_ranks("write_fails", 2, dir.path(), 20000);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks.texts[r].rfind("error", 0), 0u) << "rank " << r << ": " << ranks.texts[r];
  }
  EXPECT_NE(ranks.texts[0].find("rank 1 failed"), std::string::npos) << ranks.texts[0];
  EXPECT_NE(ranks.texts[1].find("Input/output error"), std::string::npos) << ranks.texts[1];
  EXPECT_FALSE(fs::exists(dir / "root" / "snap"));
  EXPECT_FALSE(has_temporaries(dir / "root"));
}

TEST(DistSave, RanksWithDifferentKeysGetAClearErrorAndNoSnapshot) {
  TempDir dir;
  const Ranks ranks = run_ranks("keys_differ", 2, dir.path(), 20000);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(ranks.texts[r].find("'rep.extra F32 [10]' is on rank 1 but not on rank 0"),
              std::string::npos)
        << "rank " << r << ": " << ranks.texts[r];
  }
  EXPECT_FALSE(fs::exists(dir / "root" / "snap"));
  EXPECT_FALSE(has_temporaries(dir / "root"));
}

TEST(DistSave, ASaveOneRankSkippedFailsAndTheNextSavesSucceedOnEveryRank) {
  TempDir dir;
  const Ranks ranks = run_ranks("skipped", 4, dir.path(), 3000);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks.texts[r],
              std::string(r == 3 ? "bad-skipped" : "bad-failed") + " after=ok after2=ok after3=ok")
        << "rank " << r;
  }
  EXPECT_FALSE(fs::exists(dir / "root" / "bad"));
  for (const char* name : {"after", "after2", "after3"}) {
    EXPECT_TRUE(verify(dir / "root" / name).empty()) << name;
  }
}

TEST(DistSave, RanksWithAnotherDtypeGetPeerFailedNamingBothDtypes) {
  TempDir dir;
  const Ranks ranks = run_ranks("dtype_differs", 2, dir.path(), 20000);
  const std::string code = std::to_string(static_cast<int>(ErrorCode::kPeerFailed));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks.texts[r].rfind("error " + code + " ", 0), 0u)
        << "rank " << r << ": " << ranks.texts[r];
    EXPECT_NE(
        ranks.texts[r].find("'rep.big4' is F32 [64, 64] on rank 0 but F64 [64, 64] on rank 1"),
        std::string::npos)
        << "rank " << r << ": " << ranks.texts[r];
  }
  EXPECT_FALSE(fs::exists(dir / "root" / "snap"));
}

TEST(DistPeriodic, ARankOutlivingTheStoreHostLogsOneLineAndEndsCleanly) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  const Ranks ranks = run_ranks("store_gone", 2, dir.path(), 3000, std::chrono::seconds(40));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(WIFEXITED(ranks.statuses[1])) << "rank 1 did not end";
  EXPECT_EQ(WEXITSTATUS(ranks.statuses[1]), 0);
  EXPECT_NE(ranks.texts[1].find("ended-lines 1 backtraces 0"), std::string::npos) << ranks.texts[1];
  // A store call that fails makes LibTorch's TCPStore log one warning with a backtrace (c10d's
  // own logging, which TORCH_CPP_LOG_LEVEL=ERROR silences). No call follows the first failure,
  // but two of the rank's threads that use the store may each have
  // one in flight when the host goes: at most two.
  EXPECT_LE(occurrences(ranks.errs[1], "frame #0:"), 2) << "stderr: " << ranks.errs[1];
  EXPECT_EQ(ranks.texts[1].rfind("finished", 0), 0u) << ranks.texts[1];
  EXPECT_LT(took, 30.0);
}

TEST(DistSave, ARankWhoseOwnPieceIsInvalidFailsTheOthersWithPeerFailedNamingIt) {
  TempDir dir;
  const Ranks ranks = run_ranks("bad_piece", 2, dir.path(), 5000);
  const std::string peer = "error " + std::to_string(static_cast<int>(ErrorCode::kPeerFailed));
  const std::string invalid =
      "error " + std::to_string(static_cast<int>(ErrorCode::kInvalidArgument));
  EXPECT_EQ(ranks.texts[1].rfind(invalid, 0), 0u) << ranks.texts[1];
  EXPECT_EQ(ranks.texts[0].rfind(peer + " ", 0), 0u) << ranks.texts[0];
  EXPECT_NE(ranks.texts[0].find("rank 1 failed (invalid_argument)"), std::string::npos)
      << ranks.texts[0];
  EXPECT_NE(ranks.texts[0].find("'sh'"), std::string::npos) << ranks.texts[0];
  EXPECT_FALSE(fs::exists(dir / "root" / "snap"));
}

TEST(DistSave, RanksThatSaveUnderOtherNamesAreToldTheyDisagreeOnTheName) {
  TempDir dir;
  const Ranks ranks = run_ranks("name_differs", 2, dir.path(), 2000);
  for (int r = 0; r < 2; ++r) {
    const std::string& text = ranks.texts[r];
    EXPECT_NE(text.find("the ranks disagree on the snapshot's name"), std::string::npos)
        << "rank " << r << ": " << text;
    EXPECT_NE(text.find(r == 0 ? "rank 1 saves 'b'" : "rank 0 saves 'a'"), std::string::npos)
        << "rank " << r << ": " << text;
    EXPECT_EQ(text.find("dead or stuck"), std::string::npos) << text;
    EXPECT_EQ(text.find("save 18"), std::string::npos) << "an opaque save id: " << text;
  }
}

TEST(DistSave, RanksWhosePiecesOverlapGetAClearErrorAndNoSnapshot) {
  TempDir dir;
  const Ranks ranks = run_ranks("pieces_overlap", 2, dir.path(), 20000);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(ranks.texts[r].find("share elements"), std::string::npos)
        << "rank " << r << ": " << ranks.texts[r];
    EXPECT_NE(ranks.texts[r].find("tensor 'sh'"), std::string::npos) << ranks.texts[r];
  }
  EXPECT_FALSE(fs::exists(dir / "root" / "snap"));
  EXPECT_FALSE(has_temporaries(dir / "root"));
}

TEST(DistPeriodic, SignalOnOneRankStopsAllAfterOneFinalSnapshotAndTheyResumeAlike) {
#ifndef USE_C10D_GLOO
  GTEST_SKIP() << "needs Gloo's headers (libgloo-dev) for the lockstep all-reduce";
#endif
  TempDir dir;
  const Ranks ranks = run_ranks("periodic", 2, dir.path(), 20000);
  ASSERT_EQ(ranks.texts[0], ranks.texts[1]) << "the ranks saw different runs";
  std::istringstream in(ranks.texts[0]);
  std::string word;
  int64_t stop = 0;
  int sig = 0, failed = -1;
  in >> word >> stop >> word >> sig >> word >> failed;
  EXPECT_EQ(sig, SIGUSR1) << ranks.texts[0];
  EXPECT_EQ(failed, 0) << ranks.texts[0];
  EXPECT_GT(stop, 30);
  EXPECT_LT(stop, 200) << "the signal's snapshot came too late (lead: 0.5 s of 5 ms steps)";
  const fs::path root = dir / "root";
  const auto newest = latest(root);
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->filename().string(),
            "step-" + std::string(8 - std::to_string(stop).size(), '0') + std::to_string(stop));
  EXPECT_EQ(list(root).size(), 2u) << "retention keeps 2 (rank 0 alone deletes)";
  EXPECT_TRUE(verify(*newest).empty());

  // Resume on two ranks and on one process: the same step and the same values.
  fs::remove(dir / "rank-0.txt");
  fs::remove(dir / "rank-1.txt");
  const Ranks resumed = run_ranks("resume", 2, dir.path(), 20000);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(resumed.texts[r], "resumed " + std::to_string(stop) + " equal") << "rank " << r;
  }
  Snapshotter alone({.root = root});
  StateDict sd;
  sd.insert("w", at::zeros({1000}, at::kFloat));
  PeriodicSnapshots hook(alone, Schedule({.every_steps = 4}),
                         [&] {
                           return Checkpoint::of({{"state", sd}});
                         },
                         {.log = nullptr});
  EXPECT_EQ(hook.resume([&](Checkpoint& c) { c.apply({{"state", sd}}); }), stop);
  EXPECT_TRUE(
      bitwise_equal(sd.at("w"), make_tensor(at::kFloat, {1000}, static_cast<uint64_t>(stop))));
}

TEST(DistPeriodic, ASignalLearnedAfterItsStepStopsThatRankTooAndFailsTheFinalSnapshot) {
  TempDir dir;
  const Ranks ranks = run_ranks("late-signal", 2, dir.path(), 5000);
  const std::string peer_failed = std::to_string(static_cast<int>(ErrorCode::kPeerFailed));
  EXPECT_EQ(ranks.texts[0],
            "signal " + std::to_string(SIGUSR1) + " threw " + peer_failed + " ahead")
      << ranks.texts[1];
  EXPECT_EQ(ranks.texts[1].rfind("signal " + std::to_string(SIGUSR1) + " threw ", 0), 0u)
      << ranks.texts[1];
  EXPECT_NE(ranks.texts[1], "signal " + std::to_string(SIGUSR1) + " threw nothing");
  EXPECT_FALSE(latest(dir / "root").has_value()) << "no final snapshot committed";
}

}  // namespace
}  // namespace tsnap
