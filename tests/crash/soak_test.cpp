// Kill -9 soak of a periodic-snapshot writer (label `crash`). A worker process runs a
// training-like loop with PeriodicSnapshots (a snapshot every kEvery steps, retention keeping the
// last kKeep, resume at start-up) and reports each committed step; the test kills it with SIGKILL
// hundreds of times, on one snapshot root, and after each kill checks:
//   - every committed snapshot verifies and holds exactly the state of its step (bitwise);
//   - nothing else is there but temporaries (no partial or uncommitted snapshot looks committed);
//   - the newest committed step is at least the last step the worker reported committed;
//   - at least one snapshot remains once one was committed (retention never deletes the last);
//   - the next worker removes the temporaries left behind and resumes exactly at the newest step,
//     with its state equal bitwise to that step's.
// Kill points: (a) at random times, timed from the fork (often in start-up) or from the resume
// (in training); (b) at chosen points, the k-th occurrence in a worker's life of an engine call
// (mkdir, open, write submitted or completed, fsync, rename, directory fsync, each before or after
// the call; reads while resuming), of a file removal (start-up cleanup, retention: the library's
// "remove_tree" test point) or of the resume's apply. The k are spread over the counts a worker
// without kills reports.
//
// Workers start in milliseconds: a zygote (this program run again by exec, with LibTorch loaded
// and no thread started) forks one per round. TSNAP_SOAK_RANDOM_KILLS and TSNAP_SOAK_CHOSEN_KILLS
// set how many kills of each kind (default 80 and 140), TSNAP_SOAK_DIR where the snapshot root
// goes (default: the temp directory); TSNAP_SOAK_VERBOSE=1 prints every round.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/test_point.h"
#include "crash/child_process.h"
#include "format/layout.h"
#include "io/engine.h"
#include "io/engine_host.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/checkpoint.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/periodic_snapshots.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::make_tensor;
using test_support::TempDir;

constexpr int64_t kEvery = 2;          // a snapshot every 2 steps
constexpr int kKeep = 2;               // retention: the last 2
constexpr int64_t kStepsPerLife = 10;  // a worker not killed stops after this many steps
constexpr int kHangSeconds = 60;       // a worker that takes longer has hung

// ---- The training state: after `step` steps, each tensor is its seed's values plus the step.

const StateDict& base_state() {
  static const StateDict base = [] {
    StateDict sd;
    sd.insert("w", make_tensor(at::kFloat, {3, 40000}, 11));
    sd.insert("h", make_tensor(at::kBFloat16, {50000}, 12));
    sd.insert("n", at::zeros({1}, at::kLong));
    sd.insert("frozen", make_tensor(at::kFloat, {40000}, 13));  // never changes
    return sd;
  }();
  return base;
}

StateDict expected_state(int64_t step) {
  StateDict sd;
  for (const auto& [key, entry] : base_state()) {
    sd.insert(key, key == "frozen" ? entry.tensor : entry.tensor + step);
  }
  return sd;
}

bool equals_step(const StateDict& state, int64_t step, std::string* why) {
  const StateDict expected = expected_state(step);
  if (state.size() != expected.size()) {
    *why = std::to_string(state.size()) + " tensors";
    return false;
  }
  for (const auto& [key, entry] : expected) {
    if (!state.contains(key) || !bitwise_equal(state.at(key), entry.tensor)) {
      *why = "tensor " + key + " differs from step " + std::to_string(step);
      return false;
    }
  }
  return true;
}

// ---- Kill points, counted in the worker.

enum Kind {
  kMkdir,
  kOpen,
  kWrite,
  kWriteDone,
  kFsync,
  kFsyncAfter,
  kRename,
  kRenameAfter,
  kFsyncDir,
  kFsyncDirAfter,
  kRead,
  kRemoveTree,
  kReuse,
  kApply,
  kNumKinds
};
constexpr const char* kKindNames[kNumKinds] = {
    "mkdir",       "open",        "write",        "write.done", "fsync",
    "fsync.after", "rename",      "rename.after", "fsync_dir",  "fsync_dir.after",
    "read",        "remove_tree", "reuse",        "apply"};

int kind_of(const std::string& name) {
  for (int i = 0; i < kNumKinds; ++i) {
    if (name == kKindNames[i]) return i;
  }
  return -1;
}

int g_log_fd = -1;     // the worker's report file (O_APPEND)
int g_kill_kind = -1;  // kill at the g_kill_k-th occurrence of this kind
int g_kill_k = 0;
int64_t g_kill_after_resume_us = -1;  // >= 0: kill this long after the resume (a timer thread)
std::atomic<int> g_counts[kNumKinds];

// One line to the report file: a single write(2) of O_APPEND, so lines never interleave, and
// what was written survives the SIGKILL (it is in the page cache).
void report(const std::string& line) {
  const std::string text = line + "\n";
  (void)!::write(g_log_fd, text.data(), text.size());
}

void point(Kind kind) {
  const int n = ++g_counts[kind];
  if (kind == g_kill_kind && n == g_kill_k) {
    report(std::string("k ") + kKindNames[kind] + " " + std::to_string(n));
    ::kill(::getpid(), SIGKILL);
    for (;;) ::pause();
  }
}

// Forwards every call, passing the kill points around each.
class KillPointEngine final : public io::ForwardingEngine {
 public:
  using ForwardingEngine::ForwardingEngine;
  void write(int fd, const void* buf, size_t len, uint64_t offset, int buf_index,
             io::Done done) override {
    point(kWrite);
    target()->write(fd, buf, len, offset, buf_index, [done = std::move(done)](int rc) {
      point(kWriteDone);
      done(rc);
    });
  }
  void read(int fd, void* buf, size_t len, uint64_t offset, int buf_index, io::Done done) override {
    point(kRead);
    target()->read(fd, buf, len, offset, buf_index, std::move(done));
  }
  int open(const std::string& path, int flags, mode_t mode) override {
    point(kOpen);
    return target()->open(path, flags, mode);
  }
  int fsync(int fd) override {
    point(kFsync);
    const int rc = target()->fsync(fd);
    point(kFsyncAfter);
    return rc;
  }
  int mkdir(const std::string& path) override {
    point(kMkdir);
    return target()->mkdir(path);
  }
  int rename(const std::string& from, const std::string& to, io::RenameMode mode) override {
    point(kRename);
    const int rc = target()->rename(from, to, mode);
    point(kRenameAfter);
    return rc;
  }
  int fsync_dir(const std::string& path) override {
    point(kFsyncDir);
    const int rc = target()->fsync_dir(path);
    point(kFsyncDirAfter);
    return rc;
  }
};

// ---- The worker (a fork of the zygote). Reports, one per line:
//   r <step> <1 if its state equals that step's>   resumed
//   c <step>                                       a snapshot committed (from the hook's stats)
//   f <step> <error>                               a snapshot failed
//   k <kind> <k>                                   killing itself at a chosen point
//   n <kind> <count>, then d                       not killed: its counts of each kind, done
//   x <error>                                      an exception stopped it

[[noreturn]] void run_worker(const fs::path& root, bool chosen) {
  try {
    std::unique_ptr<io::ScopedEngineOverride> override_engine;
    if (chosen) {
      // Chosen points need every engine call to pass through KillPointEngine (pwrite engine);
      // random kills run on the engine the library picks (io_uring with O_DIRECT where it can).
      override_engine = std::make_unique<io::ScopedEngineOverride>(
          std::make_shared<KillPointEngine>(io::make_pwrite_engine(2)));
      detail::set_test_point_callback([](const char* p) {
        if (std::strcmp(p, "remove_tree") == 0) point(kRemoveTree);
        if (std::strncmp(p, "reuse_", 6) == 0) point(kReuse);
      });
    }
    // TSNAP_SOAK_INCREMENTAL=1 (the incremental soak): saves reuse the frozen tensor's file.
    const char* incremental = std::getenv("TSNAP_SOAK_INCREMENTAL");
    Snapshotter snap({.root = root,
                      .chunk_bytes = 64 << 10,
                      .staging = {.budget_bytes = 1 << 20, .threads = 1},
                      .io = {.threads = 2},
                      .incremental = incremental != nullptr && *incremental == '1'});
    StateDict live;
    for (const auto& [key, entry] : base_state()) live.insert(key, entry.tensor.clone());
    PeriodicSnapshots hook(
        snap, Schedule({.every_steps = kEvery, .keep_last = kKeep}),
        [&] {
          return Checkpoint::of({{"train", live}});
        },
        {.save = {.num_shards = 2}, .when_busy = WhenBusy::kWait, .log = nullptr});
    const int64_t resumed = hook.resume([&](Checkpoint& c) {
      point(kApply);
      c.apply({{"train", live}});
    });
    std::string why;
    report("r " + std::to_string(resumed) + " " +
           (equals_step(live, resumed, &why) ? "1" : "0 " + why));
    const auto trained = std::chrono::steady_clock::now();
    if (g_kill_after_resume_us >= 0) {
      // A random moment of training, whatever the start-up took: as a SIGKILL from outside.
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::microseconds(g_kill_after_resume_us));
        report("k timer " + std::to_string(g_kill_after_resume_us));
        ::kill(::getpid(), SIGKILL);
      }).detach();
    }
    size_t seen = 0;
    auto report_new = [&] {
      const PeriodicStats stats = hook.stats();
      for (; seen < stats.snapshots.size(); ++seen) {
        const SnapshotRecord& r = stats.snapshots[seen];
        report(r.committed ? "c " + std::to_string(r.step)
                           : "f " + std::to_string(r.step) + " " + r.error);
      }
    };
    for (int64_t step = resumed + 1; step <= resumed + kStepsPerLife; ++step) {
      // A training step: the live tensors change in place.
      const StateDict next = expected_state(step);
      for (auto& [key, entry] : live) entry.tensor.copy_(next.at(key));
      hook.after_step(step);
      report_new();
    }
    hook.finish();
    report_new();
    for (int i = 0; i < kNumKinds; ++i) {
      report(std::string("n ") + kKindNames[i] + " " + std::to_string(g_counts[i].load()));
    }
    report("t " + std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::steady_clock::now() - trained)
                                     .count()));
    report("d");
    _exit(0);
  } catch (const std::exception& e) {
    report(std::string("x ") + e.what());
  }
  _exit(3);
}

int thread_count() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

// The zygote: reads commands "<chosen 0|1> <kind or -> <k> <report file>" from its command
// descriptor; for each, forks a worker, answers "<pid>", waits for it and answers "<status>".
TEST(CrashSoak, Zygote) {
  const char* env = std::getenv("TSNAP_SOAK_ZYGOTE");
  if (env == nullptr) GTEST_SKIP() << "runs only as the child of KilledPeriodicWriter...";
  int in = -1, out = -1;
  char root[4096] = {};
  if (std::sscanf(env, "%d %d %4095s", &in, &out, root) != 3) _exit(2);
  FILE* commands = ::fdopen(in, "r");
  auto answer = [&](const std::string& s) {
    const std::string line = s + "\n";
    (void)!::write(out, line.data(), line.size());
  };
  // fork() is safe only while this process has one thread.
  if (const int threads = thread_count(); threads != 1) {
    answer("E the zygote has " + std::to_string(threads) + " threads");
    _exit(2);
  }
  int chosen = 0, k = 0;
  char kind[64] = {}, log[4096] = {};
  while (std::fscanf(commands, "%d %63s %d %4095s", &chosen, kind, &k, log) == 4) {
    const pid_t pid = fork();
    if (pid == 0) {
      ::close(in);
      ::close(out);
      g_log_fd = ::open(log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
      g_kill_kind = kind_of(kind);
      g_kill_k = k;
      g_kill_after_resume_us = std::strcmp(kind, "timer") == 0 ? k : -1;
      run_worker(root, chosen != 0);
    }
    answer(std::to_string(pid));
    int status = 0;
    if (pid > 0) ::waitpid(pid, &status, 0);
    answer(std::to_string(status));
  }
  _exit(0);
}

// ---- The parent.

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

struct Report {
  std::vector<std::string> lines;
  std::optional<int64_t> resumed;
  bool resumed_ok = false;
  std::string resumed_why;
  std::vector<int64_t> committed;
  std::vector<std::string> errors;  // f and x lines
  std::map<std::string, int> counts;
  int64_t training_us = 0;  // from the resume to the end of a life without kills
  bool killed_itself = false;
  bool done = false;
};

Report read_report(const fs::path& file) {
  Report r;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    r.lines.push_back(line);
    std::istringstream s(line);
    std::string tag;
    s >> tag;
    if (tag == "r") {
      int64_t step = 0;
      int ok = 0;
      s >> step >> ok;
      r.resumed = step;
      r.resumed_ok = ok == 1;
      std::getline(s, r.resumed_why);
    } else if (tag == "c") {
      int64_t step = 0;
      s >> step;
      r.committed.push_back(step);
    } else if (tag == "f" || tag == "x") {
      r.errors.push_back(line);
    } else if (tag == "n") {
      std::string kind;
      int n = 0;
      s >> kind >> n;
      r.counts[kind] = n;
    } else if (tag == "k") {
      r.killed_itself = true;
    } else if (tag == "t") {
      s >> r.training_us;
    } else if (tag == "d") {
      r.done = true;
    }
  }
  return r;
}

class Soak {
 public:
  explicit Soak(const fs::path& dir) : root_(dir / "root"), report_(dir / "report") {
    fs::create_directories(root_);
    int to_zygote[2], from_zygote[2];
    if (::pipe2(to_zygote, O_CLOEXEC) != 0 || ::pipe2(from_zygote, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe failed");
    }
    // The zygote's ends survive exec; ours do not.
    ::fcntl(to_zygote[0], F_SETFD, 0);
    ::fcntl(from_zygote[1], F_SETFD, 0);
    zygote_ = crash_test::spawn_self(
        "CrashSoak.Zygote",
        {{"TSNAP_SOAK_ZYGOTE", std::to_string(to_zygote[0]) + " " + std::to_string(from_zygote[1]) +
                                   " " + root_.string()}});
    ::close(to_zygote[0]);
    ::close(from_zygote[1]);
    commands_ = to_zygote[1];
    // A zygote that died must fail the test, not kill it with SIGPIPE.
    previous_sigpipe_ = std::signal(SIGPIPE, SIG_IGN);
    answers_ = from_zygote[0];
  }
  ~Soak() {
    std::signal(SIGPIPE, previous_sigpipe_);
    ::close(commands_);
    ::close(answers_);
    int status = 0;
    ::waitpid(zygote_, &status, 0);
  }

  struct Outcome {
    int status = 0;
    bool hung = false;                 // still running after kHangSeconds: killed, a violation
    std::chrono::microseconds life{};  // from the fork to the zygote's answer that it ended
    Report report;
    bool killed() const { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }
  };

  // One worker's life: killed at the k-th `kind` (chosen), or after `delay` (random, when set),
  // or neither (it runs kStepsPerLife steps and exits).
  Outcome run(bool chosen, const std::string& kind, int k,
              std::optional<std::chrono::microseconds> delay) {
    // A worker killed before it opens (and truncates) the report must not leave the last
    // worker's lines there to be read as its own.
    fs::remove(report_);
    const std::string command = std::to_string(chosen ? 1 : 0) + " " + kind + " " +
                                std::to_string(k) + " " + report_.string() + "\n";
    if (::write(commands_, command.data(), command.size()) != ssize_t(command.size())) {
      throw std::runtime_error("the zygote is gone");
    }
    const std::string pid_line = answer();
    if (pid_line.empty() || pid_line[0] == 'E') throw std::runtime_error("zygote: " + pid_line);
    const pid_t pid = std::stoi(pid_line);
    const auto forked = std::chrono::steady_clock::now();
    if (delay) {
      // The zygote answers once it has reaped the worker: until then the pid is the worker's.
      pollfd ready{answers_, POLLIN, 0};
      const timespec wait{static_cast<time_t>(delay->count() / 1000000),
                          static_cast<long>(delay->count() % 1000000) * 1000};
      if (::ppoll(&ready, 1, &wait, nullptr) == 0) ::kill(pid, SIGKILL);
    }
    Outcome o;
    pollfd ended{answers_, POLLIN, 0};
    if (::poll(&ended, 1, kHangSeconds * 1000) == 0) {
      o.hung = true;
      ::kill(pid, SIGKILL);
    }
    o.status = std::stoi(answer());
    o.life = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - forked);
    o.report = read_report(report_);
    return o;
  }

  const fs::path& root() const { return root_; }

 private:
  // One line from the zygote, read unbuffered (so that poll sees what is not read yet).
  std::string answer() {
    std::string line;
    char c = 0;
    while (::read(answers_, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }

  fs::path root_;
  fs::path report_;
  pid_t zygote_ = -1;
  int commands_ = -1;
  int answers_ = -1;
  void (*previous_sigpipe_)(int) = SIG_DFL;
};

// The checks after each worker; counts violations and keeps the first messages.
class Checker {
 public:
  void after(const std::string& round, const Soak::Outcome& o, const fs::path& root) {
    const Report& r = o.report;
    if (o.hung)
      violation(round, "the worker hung (killed after " + std::to_string(kHangSeconds) + " s)");
    for (const std::string& e : r.errors) violation(round, "worker: " + e);
    if (!o.killed() && !(WIFEXITED(o.status) && WEXITSTATUS(o.status) == 0)) {
      violation(round, "worker ended with status " + std::to_string(o.status));
    }
    if (r.resumed) {
      if (*r.resumed != newest_) {
        violation(round, "resumed at step " + std::to_string(*r.resumed) + ", the newest is " +
                             std::to_string(newest_));
      }
      if (!r.resumed_ok) violation(round, "resumed state wrong:" + r.resumed_why);
      // The worker got past start-up, so it removed the temporaries left before it.
      for (const std::string& t : temporaries_) {
        if (fs::exists(root / t)) violation(round, "temporary " + t + " left after a restart");
      }
      ++resumed_;
    }
    for (int64_t step : r.committed) reported_ = std::max(reported_, step);

    // What is on disk now.
    temporaries_.clear();
    std::optional<int64_t> newest;
    int committed = 0;
    for (const Listed& l : list(root)) {
      if (!l.committed) {
        if (l.temporary) {
          temporaries_.push_back(l.name);
        } else {
          violation(round, "not committed and not a temporary: " + l.name + ": " + l.problem);
        }
        continue;
      }
      ++committed;
      const std::optional<int64_t> step = format::parse_step_name(l.name);
      if (!step) {
        violation(round, "unexpected snapshot " + l.name);
        continue;
      }
      newest = std::max(newest.value_or(0), *step);
      if (l.manifest->metadata.value("step", int64_t{-1}) != *step) {
        violation(round, l.name + ": metadata step " + l.manifest->metadata.dump());
      }
      if (!checked_.count(l.name + l.manifest->id)) {
        const std::vector<BadChunk> bad = verify(l.path);
        if (!bad.empty()) {
          violation(round,
                    l.name + " does not verify: " + bad.front().file + ": " + bad.front().problem);
        }
        std::string why;
        if (!equals_step(load_checkpoint(l.path).object_state("train"), *step, &why)) {
          violation(round, l.name + ": " + why);
        }
        checked_.insert(l.name + l.manifest->id);
      }
    }
    if (reported_ > 0 && committed == 0) violation(round, "no snapshot left");
    if (newest.value_or(0) < reported_) {
      violation(round, "newest committed step " + std::to_string(newest.value_or(0)) +
                           " < reported " + std::to_string(reported_));
    }
    newest_ = newest.value_or(0);
    max_committed_ = std::max(max_committed_, committed);
  }

  int violations() const { return violations_; }
  const std::vector<std::string>& messages() const { return messages_; }
  int64_t newest() const { return newest_; }
  int resumed() const { return resumed_; }
  int max_committed() const { return max_committed_; }

 private:
  void violation(const std::string& round, const std::string& what) {
    ++violations_;
    if (messages_.size() < 20) messages_.push_back(round + ": " + what);
  }

  int64_t newest_ = 0;    // the newest committed step on disk after the last worker
  int64_t reported_ = 0;  // the highest step any worker reported committed
  std::vector<std::string> temporaries_;
  std::set<std::string> checked_;  // snapshots verified and compared already (name + id)
  int violations_ = 0;
  int resumed_ = 0;
  int max_committed_ = 0;
  std::vector<std::string> messages_;
};

void soak(int random_kills, int chosen_kills) {
  const bool verbose = env_int("TSNAP_SOAK_VERBOSE", 0) != 0;
  const auto began = std::chrono::steady_clock::now();
  // Under the temp directory, as the other crash tests; TSNAP_SOAK_DIR picks another place.
  const char* base = std::getenv("TSNAP_SOAK_DIR");
  TempDir dir(base != nullptr && *base != '\0' ? fs::path(base) : fs::temp_directory_path());
  Soak soak(dir.path());
  Checker check;
  std::mt19937 rng(20261201);

  // Two lives without kills: the first from nothing, on the library's own engine as random kills
  // run, to time such a life; the second to count each kind of point in a life that resumes,
  // cleans up and applies retention.
  const Soak::Outcome first = soak.run(false, "-", 0, {});
  check.after("first", first, soak.root());
  // Random kills fall within [0, life]; a kill that comes too late times the next life instead.
  std::chrono::microseconds life = first.life;
  const Soak::Outcome counted = soak.run(true, "-", 0, {});
  check.after("counting", counted, soak.root());
  ASSERT_TRUE(counted.report.done) << "a life without kills did not finish";

  // The chosen points: for each kind, k spread evenly over its count, the budget shared out
  // between the kinds (a kind with fewer occurrences than its share gets every one).
  std::vector<std::pair<int, int>> points;  // (kind, k)
  {
    std::map<int, int> count;
    for (int i = 0; i < kNumKinds; ++i) {
      const auto it = counted.report.counts.find(kKindNames[i]);
      if (it != counted.report.counts.end() && it->second > 0) count[i] = it->second;
    }
    int budget = chosen_kills;
    size_t kinds_left = count.size();
    std::vector<std::pair<int, int>> by_count;  // fewest first, so leftovers go to the rest
    for (const auto& [kind, n] : count) by_count.emplace_back(n, kind);
    std::sort(by_count.begin(), by_count.end());
    for (const auto& [n, kind] : by_count) {
      const int share = kinds_left > 0 ? budget / static_cast<int>(kinds_left) : 0;
      const int take = std::min(n, share);
      for (int i = 0; i < take; ++i) {
        points.emplace_back(kind, 1 + static_cast<int>(int64_t{i} * n / take));
      }
      budget -= take;
      --kinds_left;
    }
  }
  std::shuffle(points.begin(), points.end(), rng);

  // Chosen kills (1), random kills timed from the fork (0) and from the resume (2), interleaved.
  std::vector<int> order(points.size(), 1);
  order.insert(order.end(), random_kills - random_kills / 2, 0);
  order.insert(order.end(), random_kills / 2, 2);
  // Training kills fall within [0, training]; one that comes too late times the next one.
  int64_t training_us = std::max<int64_t>(1, first.report.training_us);
  std::shuffle(order.begin(), order.end(), rng);
  int chosen_hit = 0, chosen_missed = 0, random_hit = 0, random_startup = 0, random_missed = 0;
  int random_training = 0;
  std::map<std::string, int> hits_by_kind;
  size_t next_point = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    Soak::Outcome o;
    std::string round;
    if (order[i] == 1) {
      const auto [kind, k] = points[next_point++];
      round = std::string("kill at ") + kKindNames[kind] + " #" + std::to_string(k);
      o = soak.run(true, kKindNames[kind], k, {});
      if (o.killed() && o.report.killed_itself) {
        ++chosen_hit;
        ++hits_by_kind[kKindNames[kind]];
      } else {
        ++chosen_missed;  // this life had fewer of them (e.g. no temporaries to clean)
      }
    } else if (order[i] == 2) {
      const int64_t delay = static_cast<int64_t>(rng() % static_cast<uint64_t>(training_us + 1));
      round = "kill " + std::to_string(delay) + " us after the resume";
      o = soak.run(false, "timer", static_cast<int>(delay), {});
      if (o.killed() && o.report.killed_itself) {
        ++random_hit;
        ++random_training;
      } else {
        ++random_missed;
        if (o.report.training_us > 0) training_us = o.report.training_us;
      }
    } else {
      const auto delay = std::chrono::microseconds(rng() % (life.count() + 1));
      round = "kill after " + std::to_string(delay.count()) + " us";
      o = soak.run(false, "-", 0, delay);
      if (o.killed()) {
        ++random_hit;
        if (!o.report.resumed) ++random_startup;
      } else {
        ++random_missed;
        life = o.life;
      }
    }
    check.after(round, o, soak.root());
    if (verbose) {
      std::printf("soak: %s: %s, %zu lines, newest step %lld\n", round.c_str(),
                  o.killed() ? "killed" : "finished", o.report.lines.size(),
                  static_cast<long long>(check.newest()));
    }
  }
  // A last life without kills: the restart after the last kill resumes and finishes.
  const Soak::Outcome last = soak.run(true, "-", 0, {});
  check.after("last", last, soak.root());
  EXPECT_TRUE(last.report.done);

  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::string kinds;
  for (const auto& [kind, n] : hits_by_kind) kinds += " " + kind + "=" + std::to_string(n);
  std::printf(
      "soak: %d kill points (%d chosen:%s; %d random: %d timed from the resume, of the others %d "
      "in start-up), %d chosen and %d random kills missed (the life ended first); %d restarts "
      "resumed; at most %d snapshots at once; newest step %lld; random kills within %.0f ms of "
      "the fork or %.0f ms of the resume; %d violations; %.1f s\n",
      chosen_hit + random_hit, chosen_hit, kinds.c_str(), random_hit, random_training,
      random_startup, chosen_missed, random_missed, check.resumed(), check.max_committed(),
      static_cast<long long>(check.newest()), life.count() / 1000.0, training_us / 1000.0,
      check.violations(), wall);
  for (const std::string& m : check.messages()) ADD_FAILURE() << m;
  EXPECT_EQ(check.violations(), 0);
  EXPECT_GE(chosen_hit + random_hit, (chosen_kills + random_kills) / 2);
}

TEST(CrashSoak, KilledPeriodicWriterKeepsCommittedSnapshotsAndResumesExactly) {
  soak(env_int("TSNAP_SOAK_RANDOM_KILLS", 80), env_int("TSNAP_SOAK_CHOSEN_KILLS", 140));
}

// The same with incremental saves: snapshots share the frozen tensor's file through hard links,
// and kills also land in the reuse of the base's files ("reuse": linked or copied in).
TEST(CrashSoak, KilledIncrementalWriterKeepsCommittedSnapshotsAndResumesExactly) {
  ::setenv("TSNAP_SOAK_INCREMENTAL", "1", 1);
  soak(env_int("TSNAP_SOAK_RANDOM_KILLS", 80) / 2, env_int("TSNAP_SOAK_CHOSEN_KILLS", 140) / 2);
  ::unsetenv("TSNAP_SOAK_INCREMENTAL");
}

}  // namespace
}  // namespace tsnap
