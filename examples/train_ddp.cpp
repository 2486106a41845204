// Data-parallel training of the demo transformer on 2 processes with distributed snapshots:
// each rank trains on its own batches, gradients are all-reduced over Gloo (LibTorch's c10d),
// and tsnap's PeriodicSnapshots takes a snapshot every N steps with the two ranks writing one
// snapshot together (each half of the replicated model and optimizer state, rank 0 commits).
//
//   tsnap_example_train_ddp [--steps T] [--every N] [--preempt-at-step P] [--dir DIR]
//
// The demo runs four trainings as child processes and compares their loss curves bit for bit:
//   1. 2 ranks, no snapshots (the reference);
//   2. 2 ranks with snapshots; rank 1 alone gets SIGTERM after step P: the hooks agree on a
//      final snapshot a few steps later, commit it, and both processes end by SIGTERM;
//   3. 2 ranks, restarted: they resume from the newest snapshot and train to step T;
//   4. 1 process, restarted from a copy of what run 2 left: it resumes the same snapshot and
//      trains to T doing both ranks' work (their two batches per step, gradients summed in the
//      same order as the all-reduce), which with 2 ranks gives the same floats. (With more
//      ranks the all-reduce's summation order is the ring's, which one process would have to
//      replicate; dropout is off so that no per-rank random state needs saving: each rank's
//      batches are drawn from a generator seeded by (step, rank).)
// It exits with 0 only when runs 2+3 and 2+4 match run 1 bit for bit.
//
// A child is `tsnap_example_train_ddp --run OUT [--root DIR] [--preempt] [--single]` with RANK,
// WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (as torchrun sets them) unless --single.

#include <ATen/CPUGeneratorImpl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <tsnap/checkpoint.h>
#include <tsnap/dist_group.h>
#include <tsnap/periodic_snapshots.h>
#include <tsnap/remove.h>
#include <tsnap/schedule.h>
#include <tsnap/snapshotter.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "demo_model.h"

namespace fs = std::filesystem;
using namespace tsnap_demo;

namespace {

constexpr int kWorld = 2;

struct Args {
  int64_t steps = 120;
  int64_t every = 20;
  int64_t preempt_at = 50;
  fs::path dir;
  fs::path run_out;  // set: a child run
  fs::path root;     // child: snapshot root (empty: none)
  bool preempt = false;
  bool single = false;
};

[[noreturn]] void usage(const std::string& message) {
  std::fprintf(stderr,
               "%s%susage: tsnap_example_train_ddp [--steps T] [--every N] [--preempt-at-step P] "
               "[--dir DIR]\n",
               message.c_str(), message.empty() ? "" : "\n");
  std::exit(message.empty() ? 0 : 2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage("");
    if (arg == "--preempt" || arg == "--single") {
      (arg == "--preempt" ? a.preempt : a.single) = true;
      continue;
    }
    if (i + 1 >= argc) usage("error: missing value after " + arg);
    const std::string value = argv[++i];
    if (arg == "--steps" || arg == "--every" || arg == "--preempt-at-step") {
      const int64_t v = std::atoll(value.c_str());
      if (v <= 0) usage("error: " + arg + " takes a positive integer");
      (arg == "--steps" ? a.steps : arg == "--every" ? a.every : a.preempt_at) = v;
    } else if (arg == "--dir") {
      a.dir = value;
    } else if (arg == "--run") {
      a.run_out = value;
    } else if (arg == "--root") {
      a.root = value;
    } else {
      usage("error: unknown option " + arg);
    }
  }
  if (a.preempt_at >= a.steps) usage("error: --preempt-at-step must be below --steps");
  return a;
}

// Rank `rank`'s batch at `step`: from a generator seeded by both, so no random state needs
// saving and one process can draw every rank's batch.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t step, int rank) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
      static_cast<uint64_t>(kSeed) + 1000003ull * static_cast<uint64_t>(step) +
      static_cast<uint64_t>(rank));
  return make_batch(gen);
}

// A child: rank RANK of a 2-rank training, or (--single) one process doing both ranks' work.
int child_run(const Args& args) {
  torch::manual_seed(kSeed);  // the same initial weights on every rank
  torch::set_num_threads(1);
  Transformer model(/*dropout=*/0.0);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));

  std::shared_ptr<tsnap::DistGroup> group;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  int rank = 0;
  if (!args.single) {
    group = tsnap::DistGroup::from_env({.timeout = std::chrono::seconds(60)});
    rank = group->rank();
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("train", group->store()), rank, group->world_size(),
        options);
  }
  // Sums `t` over the ranks, in place.
  const auto all_reduce = [&](torch::Tensor& t) {
    std::vector<at::Tensor> v{t};
    pg->allreduce(v)->wait();
  };

  std::ostringstream out;
  std::unique_ptr<tsnap::Snapshotter> snapshotter;
  std::unique_ptr<tsnap::PeriodicSnapshots> hook;
  int64_t step = 0;
  if (!args.root.empty()) {
    tsnap::SnapshotterOptions options;
    options.root = args.root;
    options.staging.budget_bytes = 64ull << 20;
    options.chunk_bytes = 4ull << 20;
    options.group = group;  // null with --single: an ordinary Snapshotter
    snapshotter = std::make_unique<tsnap::Snapshotter>(options);
    tsnap::PeriodicOptions periodic;
    periodic.log = [&](const std::string& line) { out << "log " << line << "\n"; };
    hook = std::make_unique<tsnap::PeriodicSnapshots>(
        *snapshotter,
        tsnap::Schedule({.every_steps = args.every, .on_signals = {SIGTERM}, .keep_last = 2}),
        [&] {
          return tsnap::Checkpoint::of(
              {{"model", model}, {"optim", tsnap::bind(optimizer, model)}});
        },
        periodic);
    step = hook->resume([&](tsnap::Checkpoint& c) {
      c.apply({{"model", model}, {"optim", tsnap::bind(optimizer, model)}});
    });
    if (step > 0) out << "resumed " << step << "\n";
  }

  while (step < args.steps) {
    ++step;
    optimizer.zero_grad();
    torch::Tensor loss = torch::zeros({1});
    if (args.single) {
      for (int r = 0; r < kWorld; ++r) {  // gradients accumulate: g0 + g1, as the all-reduce
        const auto [tokens, target] = batch(step, r);
        loss += forward_backward(model, tokens, target).detach().reshape({1});
      }
    } else {
      const auto [tokens, target] = batch(step, rank);
      loss += forward_backward(model, tokens, target).detach().reshape({1});
      std::vector<torch::Tensor> grads;
      for (const torch::Tensor& p : model->parameters()) grads.push_back(p.grad().reshape({-1}));
      torch::Tensor flat = torch::cat(grads);
      all_reduce(flat);
      int64_t at = 0;
      for (const torch::Tensor& p : model->parameters()) {
        p.mutable_grad().copy_(flat.narrow(0, at, p.numel()).view_as(p));
        at += p.numel();
      }
      all_reduce(loss);
    }
    for (const torch::Tensor& p : model->parameters()) p.mutable_grad().div_(kWorld);
    optimizer.step();
    const float mean = (loss / kWorld).item<float>();
    uint32_t bits;
    std::memcpy(&bits, &mean, sizeof bits);
    char line[64];
    std::snprintf(line, sizeof line, "loss %" PRId64 " %08x\n", step, bits);
    out << line;
    if (hook) hook->after_step(step);
    if (hook && hook->stop_requested()) break;
    if (args.preempt && rank == 1 && step == args.preempt_at) ::raise(SIGTERM);
  }
  int stop_signal = 0;
  if (hook) {
    stop_signal = hook->stop_signal();
    const tsnap::PeriodicStats stats = hook->finish();
    out << "snapshots " << stats.snapshots.size() << " failed " << stats.failed << "\n";
    if (stop_signal != 0) out << "stopped " << stop_signal << " " << step << "\n";
    hook.reset();
    snapshotter.reset();
  }
  std::ofstream(args.run_out.string() + ".rank" + std::to_string(rank)) << out.str();
  std::fflush(nullptr);
  if (stop_signal != 0) {
    ::signal(stop_signal, SIG_DFL);
    ::raise(stop_signal);
  }
  std::_Exit(0);  // the Gloo group's threads need no orderly teardown
}

// ---------------------------------------------------------------------------------------------
// The demo.

struct Run {
  std::map<int64_t, uint32_t> loss_bits;  // rank 0's (the mean over the ranks)
  std::vector<std::string> lines;         // every rank's other lines
  int64_t resumed = 0;
  int64_t stopped_at = 0;
  std::vector<int> statuses;
};

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Runs `ranks` processes of this program (1 = --single) and reads what they wrote.
Run run_children(const Args& args, const fs::path& out, int ranks, std::vector<std::string> extra) {
  std::vector<std::string> argv = {"tsnap_example_train_ddp",
                                   "--run",
                                   out.string(),
                                   "--steps",
                                   std::to_string(args.steps),
                                   "--every",
                                   std::to_string(args.every),
                                   "--preempt-at-step",
                                   std::to_string(args.preempt_at)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (ranks == 1) argv.push_back("--single");
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const std::string port = std::to_string(free_port());
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::execv("/proc/self/exe", cargv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  Run run;
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    run.statuses.push_back(status);
  }
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(out.string() + ".rank" + std::to_string(r));
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream is(line);
      std::string kind;
      is >> kind;
      if (kind == "loss" && r == 0) {
        int64_t step;
        std::string hex;
        is >> step >> hex;
        run.loss_bits[step] = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
      } else if (kind == "resumed") {
        is >> run.resumed;
      } else if (kind == "stopped") {
        int sig;
        is >> sig >> run.stopped_at;
      }
      if (kind != "loss") run.lines.push_back("rank " + std::to_string(r) + ": " + line);
    }
  }
  return run;
}

// Steps of `reference` whose loss `curve` has bit for bit.
int64_t same_steps(const std::map<int64_t, uint32_t>& reference,
                   const std::map<int64_t, uint32_t>& curve) {
  int64_t same = 0;
  for (const auto& [step, bits] : reference) {
    const auto it = curve.find(step);
    same += it != curve.end() && it->second == bits;
  }
  return same;
}

void print_lines(const Run& run, const char* match) {
  for (const std::string& l : run.lines) {
    if (l.find(match) != std::string::npos) std::printf("      %s\n", l.c_str());
  }
}

int demo(const Args& args) {
  const bool temporary = args.dir.empty();
  const fs::path dir =
      temporary ? fs::temp_directory_path() / ("tsnap-train-ddp-" + std::to_string(::getpid()))
                : args.dir;
  tsnap::remove_tree(dir);
  fs::create_directories(dir);
  std::printf(
      "tsnap data-parallel demo: the demo transformer on %d ranks (Gloo all-reduce), %" PRId64
      " steps, a distributed snapshot every %" PRId64 " steps under %s\n\n",
      kWorld, args.steps, args.every, dir.c_str());

  std::printf("[1/4] 2 ranks, no snapshots ...\n");
  const Run ref = run_children(args, dir / "run1", kWorld, {});
  std::printf("      %zu steps\n", ref.loss_bits.size());

  std::printf("[2/4] 2 ranks with snapshots; SIGTERM to rank 1 alone after step %" PRId64 " ...\n",
              args.preempt_at);
  const fs::path root = dir / "snapshots";
  const Run pre = run_children(args, dir / "run2", kWorld, {"--root", root.string(), "--preempt"});
  print_lines(pre, "signal");
  bool both_stopped = true;
  for (int status : pre.statuses)
    both_stopped &= WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM;
  std::printf("      both ranks stopped after step %" PRId64 " by SIGTERM: %s\n", pre.stopped_at,
              both_stopped ? "yes" : "NO");
  fs::copy(root, dir / "snapshots-copy", fs::copy_options::recursive);

  std::printf("[3/4] 2 ranks, restarted ...\n");
  const Run two = run_children(args, dir / "run3", kWorld, {"--root", root.string()});
  print_lines(two, "resumed from");
  std::printf(
      "[4/4] 1 process doing both ranks' work, restarted from a copy of run 2's "
      "snapshots ...\n");
  const Run one =
      run_children(args, dir / "run4", 1, {"--root", (dir / "snapshots-copy").string()});
  print_lines(one, "resumed from");

  const auto joined = [&](const Run& after) {
    std::map<int64_t, uint32_t> curve;
    for (const auto& [step, bits] : pre.loss_bits) {
      if (step <= after.resumed) curve[step] = bits;
    }
    for (const auto& [step, bits] : after.loss_bits) curve[step] = bits;
    return curve;
  };
  const int64_t same2 = same_steps(ref.loss_bits, joined(two));
  const int64_t same1 = same_steps(ref.loss_bits, joined(one));
  const bool ok2 = same2 == args.steps && two.resumed == pre.stopped_at;
  const bool ok1 = same1 == args.steps && one.resumed == pre.stopped_at;
  std::printf("\nsummary\n");
  std::printf("  %-52s step %" PRId64 "\n", "final snapshot of the preempted run", pre.stopped_at);
  std::printf("  %-52s %s (%" PRId64 " of %" PRId64 " steps equal)\n",
              "loss curve, preempted + resumed on 2 ranks",
              ok2 ? "identical (bitwise)" : "DIFFERENT", same2, args.steps);
  std::printf("  %-52s %s (%" PRId64 " of %" PRId64 " steps equal)\n",
              "loss curve, preempted + resumed on 1 process",
              ok1 ? "identical (bitwise)" : "DIFFERENT", same1, args.steps);
  if (temporary) tsnap::remove_tree(dir);
  return ok1 && ok2 && both_stopped ? 0 : 1;
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
