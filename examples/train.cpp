// Trains a small transformer with periodic asynchronous snapshots (tsnap::PeriodicSnapshots),
// is preempted by SIGTERM partway, restarts, resumes from the newest snapshot, and checks that the
// loss curve is bitwise identical to an uninterrupted run. It also measures the step-time
// overhead of the snapshots.
//
//   tsnap_example_train [--steps T] [--every N] [--preempt-at-step P] [--dir DIR] [--threads K]
//                       [--repeat R]
//
// The demo runs this program four times as child processes (so that a preemption really ends a
// process): 1. uninterrupted without snapshots (the reference loss curve and step time);
// 2. uninterrupted with a snapshot every N steps (the overhead); 3. with snapshots, raising
// SIGTERM at step P: the hook takes a final snapshot at the next step boundary, waits for its
// commit, and the process ends by SIGTERM; 4. the restart, which resumes from the newest
// snapshot and trains to step T. It prints the curves, a per-snapshot table and a summary, and
// exits with 0 only when runs 2 and 3+4 match run 1 bit for bit.
//
// A child run is `tsnap_example_train --run OUT [--root DIR] ...`; it writes its losses, step
// times and snapshot figures to OUT.

#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <tsnap/checkpoint.h>
#include <tsnap/periodic_snapshots.h>
#include <tsnap/remove.h>
#include <tsnap/schedule.h>
#include <tsnap/snapshotter.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "demo_model.h"

namespace fs = std::filesystem;

namespace {

using namespace tsnap_demo;  // the model and its training step (demo_model.h)

// ---------------------------------------------------------------------------------------------
// Options.

struct Args {
  int64_t steps = 200;
  int64_t every = 20;
  int64_t preempt_at = 90;
  int threads = 1;
  int repeat = 1;        // demo: how many times runs 1 and 2 alternate (for the overhead figure)
  fs::path dir;          // demo: where to keep the snapshots (empty: a temporary directory)
  fs::path run_out;      // set: a child run writing its results here
  fs::path root;         // child run: snapshot root (empty: no snapshots)
  bool preempt = false;  // child run: raise SIGTERM at preempt_at
};

[[noreturn]] void usage(const char* message) {
  if (message != nullptr) std::fprintf(stderr, "error: %s\n", message);
  std::fprintf(message != nullptr ? stderr : stdout,
               "usage: tsnap_example_train [--steps T] [--every N] [--preempt-at-step P]\n"
               "                           [--dir DIR] [--threads K] [--repeat R]\n"
               "  --steps T            training steps (default 200)\n"
               "  --every N            snapshot every N steps (default 20)\n"
               "  --preempt-at-step P  the preempted run raises SIGTERM after step P "
               "(default 90)\n"
               "  --dir DIR            keep the snapshots under DIR (default: a temporary "
               "directory, removed at exit)\n"
               "  --threads K          LibTorch intra-op threads (default 1)\n"
               "  --repeat R           alternate the runs without and with snapshots R times;\n"
               "                       the overhead compares the fastest of each (default 1)\n");
  std::exit(message != nullptr ? 2 : 0);
}

int64_t positive(const char* value, const std::string& option) {
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (*end != '\0' || v <= 0) usage((option + " takes a positive integer").c_str());
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(nullptr);
    if (arg == "--preempt") {
      a.preempt = true;
      continue;
    }
    if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
    const char* value = argv[++i];
    if (arg == "--steps") {
      a.steps = positive(value, arg);
    } else if (arg == "--every") {
      a.every = positive(value, arg);
    } else if (arg == "--preempt-at-step") {
      a.preempt_at = positive(value, arg);
    } else if (arg == "--repeat") {
      a.repeat = static_cast<int>(positive(value, arg));
    } else if (arg == "--threads") {
      a.threads = static_cast<int>(positive(value, arg));
    } else if (arg == "--dir") {
      a.dir = value;
    } else if (arg == "--run") {
      a.run_out = value;
    } else if (arg == "--root") {
      a.root = value;
    } else {
      usage(("unknown option " + arg).c_str());
    }
  }
  if (a.preempt_at >= a.steps) usage("--preempt-at-step must be below --steps");
  return a;
}

// ---------------------------------------------------------------------------------------------
// A child run: trains, with or without snapshots, and writes what happened to `run_out`:
//   loss <step> <float bits as hex> <step seconds>
//   snapshot <step> <reason> <blocked> <stall> <stage> <write> <commit> <total> <bytes>
//   resumed <step> | stopped <signal> <step> | log <line> | info <key> <value>

int child_run(const Args& args) {
  torch::manual_seed(kSeed);
  torch::set_num_threads(args.threads);
  Transformer model;
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  // The learning rate halves every 60 steps: a resume must restore the scheduler's position too.
  torch::optim::StepLR scheduler(optimizer, /*step_size=*/60, /*gamma=*/0.5);

  std::ostringstream out;
  std::vector<std::string> log;
  std::unique_ptr<tsnap::Snapshotter> snapshotter;
  std::unique_ptr<tsnap::PeriodicSnapshots> hook;
  int64_t step = 0;
  if (!args.root.empty()) {
    tsnap::SnapshotterOptions options;
    options.root = args.root;
    options.staging.budget_bytes = 64ull << 20;
    options.chunk_bytes = 4ull << 20;
    snapshotter = std::make_unique<tsnap::Snapshotter>(options);
    tsnap::Schedule schedule({.every_steps = args.every,
                              .on_signals = {SIGTERM, SIGUSR1},
                              .keep_last = 2,
                              .keep_every_steps = 4 * args.every});
    tsnap::PeriodicOptions periodic;
    periodic.log = [&](const std::string& line) { log.push_back(line); };
    hook = std::make_unique<tsnap::PeriodicSnapshots>(
        *snapshotter, schedule,
        [&] {
          return tsnap::Checkpoint::of({{"model", model},
                                        {"optim", tsnap::bind(optimizer, model)},
                                        {"sched", scheduler},
                                        {"rng", tsnap::rng_state()}});
        },
        periodic);
    step = hook->resume([&](tsnap::Checkpoint& c) {
      c.apply({{"model", model},
               {"optim", tsnap::bind(optimizer, model)},
               {"sched", scheduler},
               {"rng", tsnap::rng_state()}});
    });
    if (step > 0) out << "resumed " << step << "\n";
  }
  using Clock = std::chrono::steady_clock;
  while (step < args.steps) {
    const Clock::time_point began = Clock::now();
    const float loss = train_step(model, optimizer);
    scheduler.step();
    ++step;
    if (hook) hook->after_step(step);
    const double seconds = std::chrono::duration<double>(Clock::now() - began).count();
    uint32_t bits;
    std::memcpy(&bits, &loss, sizeof bits);
    char line[96];
    std::snprintf(line, sizeof line, "loss %" PRId64 " %08x %.9f\n", step, bits, seconds);
    out << line;
    if (hook && hook->stop_requested()) break;
    // Preemption, as a cluster scheduler would deliver it (the handler only records it; the
    // next step boundary takes the final snapshot).
    if (args.preempt && step == args.preempt_at) ::raise(SIGTERM);
  }
  int stop_signal = 0;
  if (hook) {
    stop_signal = hook->stop_signal();
    const tsnap::PeriodicStats stats = hook->finish();
    for (const tsnap::SnapshotRecord& r : stats.snapshots) {
      const tsnap::SaveStats& s = r.save;
      out << "snapshot " << r.step << " " << tsnap::to_string(r.reason) << " " << r.blocked_s << " "
          << s.stall_s << " " << s.stage_s << " " << s.write_s << " " << s.commit_s << " "
          << s.total_s << " " << s.bytes << "\n";
    }
    out << "info skipped " << stats.skipped << "\n";
    out << "info engine " << snapshotter->engine_name() << "\n";
    if (stop_signal != 0) out << "stopped " << stop_signal << " " << step << "\n";
    hook.reset();  // restores the signal dispositions from before the hook
    snapshotter.reset();
  }
  for (const std::string& l : log) out << "log " << l << "\n";
  out << "info params " << parameter_count(model) << "\n";
  std::ofstream(args.run_out) << out.str();
  if (stop_signal != 0) {
    // The conventional end of a preempted process: die by the signal, with its default action.
    ::signal(stop_signal, SIG_DFL);
    ::raise(stop_signal);
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The demo: runs the children, compares, prints.

struct Snapshot {
  int64_t step;
  std::string reason;
  double blocked, stall, stage, write, commit, total;
  uint64_t bytes;
};

struct Run {
  std::map<int64_t, uint32_t> loss_bits;
  std::map<int64_t, double> step_s;
  std::vector<Snapshot> snapshots;
  std::vector<std::string> log;
  std::map<std::string, std::string> info;
  int64_t resumed = 0;
  int stopped_signal = 0;
  int64_t stopped_at = 0;
  int status = 0;  // from waitpid
};

Run read_run(const fs::path& file, int status) {
  Run r;
  r.status = status;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream is(line);
    std::string kind;
    is >> kind;
    if (kind == "loss") {
      int64_t step;
      std::string hex;
      double s;
      is >> step >> hex >> s;
      r.loss_bits[step] = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
      r.step_s[step] = s;
    } else if (kind == "snapshot") {
      Snapshot s;
      is >> s.step >> s.reason >> s.blocked >> s.stall >> s.stage >> s.write >> s.commit >>
          s.total >> s.bytes;
      r.snapshots.push_back(s);
    } else if (kind == "resumed") {
      is >> r.resumed;
    } else if (kind == "stopped") {
      is >> r.stopped_signal >> r.stopped_at;
    } else if (kind == "log") {
      r.log.push_back(line.substr(4));
    } else if (kind == "info") {
      std::string key, value;
      is >> key;
      std::getline(is >> std::ws, value);
      r.info[key] = value;
    }
  }
  return r;
}

// Runs this program with `extra` arguments and the run options; returns its results.
Run run_child(const Args& args, const fs::path& out, std::vector<std::string> extra) {
  std::vector<std::string> argv = {"tsnap_example_train",
                                   "--run",
                                   out.string(),
                                   "--steps",
                                   std::to_string(args.steps),
                                   "--every",
                                   std::to_string(args.every),
                                   "--preempt-at-step",
                                   std::to_string(args.preempt_at),
                                   "--threads",
                                   std::to_string(args.threads)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
  if (pid == 0) {
    ::execv("/proc/self/exe", cargv.data());
    std::perror("execv /proc/self/exe");
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return read_run(out, status);
}

double mean_step_ms(const Run& r) {
  double sum = 0;
  for (const auto& [step, s] : r.step_s) sum += s;
  return r.step_s.empty() ? 0 : 1e3 * sum / static_cast<double>(r.step_s.size());
}

double median_step_ms(const Run& r) {
  std::vector<double> v;
  for (const auto& [step, s] : r.step_s) v.push_back(s);
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return 1e3 * v[v.size() / 2];
}

float as_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Steps where `b` has a loss and it equals `a`'s bit for bit, and steps compared.
std::pair<int64_t, int64_t> compare(const std::map<int64_t, uint32_t>& a,
                                    const std::map<int64_t, uint32_t>& b) {
  int64_t same = 0;
  for (const auto& [step, bits] : a) {
    const auto it = b.find(step);
    if (it != b.end() && it->second == bits) ++same;
  }
  return {same, static_cast<int64_t>(a.size())};
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return std::string("ended by ") + strsignal(WTERMSIG(status));
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

int demo(const Args& args) {
  const bool temporary = args.dir.empty();
  const fs::path dir =
      temporary ? fs::temp_directory_path() / ("tsnap-train-" + std::to_string(::getpid()))
                : args.dir;
  tsnap::remove_tree(dir / "with-snapshots");
  tsnap::remove_tree(dir / "preempted");
  fs::create_directories(dir);

  std::printf("tsnap training demo: a %" PRId64 "-layer transformer (d_model %" PRId64 ", %" PRId64
              " heads), AdamW + StepLR, synthetic batches of %" PRId64 "x%" PRId64
              " tokens, %" PRId64 " steps, %d LibTorch thread(s)\n",
              kLayers, kWidth, kHeads, kBatch, kSeq, args.steps, args.threads);
  std::printf("snapshots of model + optimizer + LR scheduler + RNG every %" PRId64
              " steps (keep the last 2 and every %" PRId64 "th step) under %s\n\n",
              args.every, 4 * args.every, dir.c_str());

  // Runs 1 and 2 alternate `repeat` times; the overhead compares the fastest of each, which
  // filters out load from other processes. The tables show the first pair.
  std::vector<double> means1, means2;
  Run base, snap;
  bool ok2 = true;
  for (int r = 0; r < args.repeat; ++r) {
    const std::string round = args.repeat > 1 ? " (round " + std::to_string(r + 1) + ")" : "";
    std::printf("[1/4] uninterrupted, no snapshots%s ...\n", round.c_str());
    Run one = run_child(args, dir / "run1.txt", {});
    std::printf("      %zu steps, %.2f ms/step (median %.2f), %s\n", one.loss_bits.size(),
                mean_step_ms(one), median_step_ms(one), describe_status(one.status).c_str());
    std::printf("[2/4] uninterrupted, snapshots every %" PRId64 " steps%s ...\n", args.every,
                round.c_str());
    tsnap::remove_tree(dir / "with-snapshots");
    Run two = run_child(args, dir / "run2.txt", {"--root", (dir / "with-snapshots").string()});
    std::printf("      %zu steps, %.2f ms/step (median %.2f), %zu snapshots (%s skipped), %s, %s\n",
                two.loss_bits.size(), mean_step_ms(two), median_step_ms(two), two.snapshots.size(),
                two.info.count("skipped") ? two.info.at("skipped").c_str() : "?",
                two.info.count("engine") ? two.info.at("engine").c_str() : "?",
                describe_status(two.status).c_str());
    means1.push_back(mean_step_ms(one));
    means2.push_back(mean_step_ms(two));
    const auto [same, n] = compare(one.loss_bits, two.loss_bits);
    ok2 = ok2 && same == n && n == args.steps;
    if (r == 0) {
      base = std::move(one);
      snap = std::move(two);
    }
  }

  std::printf("[3/4] preempted: SIGTERM raised after step %" PRId64 " ...\n", args.preempt_at);
  const Run pre =
      run_child(args, dir / "run3.txt", {"--root", (dir / "preempted").string(), "--preempt"});
  std::printf("      stopped by signal %d after step %" PRId64 ", %s\n", pre.stopped_signal,
              pre.stopped_at, describe_status(pre.status).c_str());
  for (const std::string& l : pre.log) {
    if (l.find("signal") != std::string::npos) std::printf("        %s\n", l.c_str());
  }

  std::printf("[4/4] restarted ...\n");
  const Run post = run_child(args, dir / "run4.txt", {"--root", (dir / "preempted").string()});
  for (const std::string& l : post.log) {
    if (l.find("resume") != std::string::npos) std::printf("        %s\n", l.c_str());
  }
  std::printf("      resumed at step %" PRId64 ", trained to step %" PRId64 ", %s\n", post.resumed,
              post.loss_bits.empty() ? 0 : post.loss_bits.rbegin()->first,
              describe_status(post.status).c_str());

  // The preempted run's curve up to its final snapshot, then the restarted run's.
  std::map<int64_t, uint32_t> joined;
  for (const auto& [step, bits] : pre.loss_bits) {
    if (step <= post.resumed) joined[step] = bits;
  }
  for (const auto& [step, bits] : post.loss_bits) joined[step] = bits;

  std::printf("\nloss curves (every %" PRId64 " steps; * marks a step that differs):\n",
              std::max<int64_t>(1, args.steps / 10));
  std::printf("  %6s  %-24s %-24s %-24s\n", "step", "1: no snapshots", "2: snapshots",
              "3+4: preempted, resumed");
  const int64_t stride = std::max<int64_t>(1, args.steps / 10);
  for (int64_t step = stride; step <= args.steps; step += stride) {
    auto cell = [&](const std::map<int64_t, uint32_t>& m) {
      char buf[40];
      const auto it = m.find(step);
      if (it == m.end()) return std::string("-");
      const bool same = base.loss_bits.count(step) && base.loss_bits.at(step) == it->second;
      std::snprintf(buf, sizeof buf, "%.7f (%08x)%s", as_float(it->second), it->second,
                    same ? "" : " *");
      return std::string(buf);
    };
    std::printf("  %6" PRId64 "  %-24s %-24s %-24s\n", step, cell(base.loss_bits).c_str(),
                cell(snap.loss_bits).c_str(), cell(joined).c_str());
  }
  const auto [same2, n2] = compare(base.loss_bits, snap.loss_bits);
  const auto [same34, n34] = compare(base.loss_bits, joined);
  ok2 = ok2 && same2 == n2 && n2 == args.steps;
  const bool ok34 = same34 == n34 && n34 == args.steps;
  std::printf("bitwise comparison with run 1, all %" PRId64 " steps: run 2 %s (%" PRId64
              " equal), runs 3+4 %s (%" PRId64 " equal)\n",
              args.steps, ok2 ? "IDENTICAL" : "DIFFERENT", same2, ok34 ? "IDENTICAL" : "DIFFERENT",
              same34);

  // Per-snapshot figures of run 2, against its median step time.
  const double median2 = median_step_ms(snap);
  std::printf("\nsnapshots of run 2 (median step %.2f ms):\n", median2);
  std::printf("  %-14s %-6s %8s %10s %9s %9s %9s %9s %9s %10s\n", "snapshot", "reason", "MB",
              "blocked ms", "stall ms", "stage ms", "write ms", "commit ms", "total ms", "step ms");
  double blocked_total = 0;
  uint64_t bytes = 0;
  for (const Snapshot& s : snap.snapshots) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%08" PRId64, s.step);
    const auto it = snap.step_s.find(s.step);
    std::printf("  %-14s %-6s %8.1f %10.2f %9.2f %9.2f %9.2f %9.2f %9.2f %10.2f\n", name,
                s.reason.c_str(), s.bytes / 1e6, 1e3 * s.blocked, 1e3 * s.stall, 1e3 * s.stage,
                1e3 * s.write, 1e3 * s.commit, 1e3 * s.total,
                it == snap.step_s.end() ? 0.0 : 1e3 * it->second);
    blocked_total += s.blocked;
    bytes = std::max(bytes, s.bytes);
  }
  double train_total = 0;
  for (const auto& [step, s] : snap.step_s) train_total += s;

  const double mean1 = *std::min_element(means1.begin(), means1.end());
  const double mean2 = *std::min_element(means2.begin(), means2.end());
  const double overhead = mean1 > 0 ? 100.0 * (mean2 - mean1) / mean1 : 0;
  std::printf("\nsummary\n");
  std::printf("  %-50s %s\n", "model parameters",
              base.info.count("params") ? base.info.at("params").c_str() : "?");
  std::printf("  %-50s %.1f MB\n", "snapshot size (model + AdamW + StepLR + RNG)", bytes / 1e6);
  const std::string best = args.repeat > 1 ? ", best of " + std::to_string(args.repeat) : "";
  std::printf("  %-50s %.2f ms\n", ("mean step time, no snapshots (run 1" + best + ")").c_str(),
              mean1);
  std::printf("  %-50s %.2f ms\n", ("mean step time, with snapshots (run 2" + best + ")").c_str(),
              mean2);
  std::printf("  %-50s %+.2f %%\n", "step-time overhead (run 2 vs run 1)", overhead);
  std::printf("  %-50s %.1f ms of %.2f s (%.3f %%)\n", "training blocked by snapshots (run 2)",
              1e3 * blocked_total, train_total,
              train_total > 0 ? 100.0 * blocked_total / train_total : 0);
  std::printf("  %-50s %s at step %" PRId64 ", final snapshot committed\n", "preemption (run 3)",
              pre.stopped_signal ? strsignal(pre.stopped_signal) : "none", pre.stopped_at);
  std::printf("  %-50s step %" PRId64 "\n", "resumed from (run 4)", post.resumed);
  std::printf("  %-50s %s\n", "loss curve with snapshots",
              ok2 ? "identical (bitwise)" : "DIFFERENT");
  std::printf("  %-50s %s\n", "loss curve preempted + resumed",
              ok34 ? "identical (bitwise)" : "DIFFERENT");

  if (temporary) {
    tsnap::remove_tree(dir);
  } else {
    std::printf("\nsnapshots kept: %s/with-snapshots and %s/preempted\n", dir.c_str(), dir.c_str());
  }
  const bool preempted = pre.stopped_signal == SIGTERM && WIFSIGNALED(pre.status) &&
                         WTERMSIG(pre.status) == SIGTERM && post.resumed == pre.stopped_at;
  if (!preempted) std::printf("error: the preemption did not go as planned\n");
  return ok2 && ok34 && preempted ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  try {
    return args.run_out.empty() ? demo(args) : child_run(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
