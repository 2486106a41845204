#include "bench/timeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "bench/measure.h"
#include "bench/session.h"
#include "common/remove_tree.h"
#include "tsnap/snapshotter.h"

namespace fs = std::filesystem;

namespace tsnap::bench {
namespace {

class TrainSim {
 public:
  TrainSim(const StateDict& state, double step_ms) {
    constexpr uint64_t kScratchMax = 32ull << 20;
    for (const auto& [key, e] : state) {
      if (!e.tensor.is_floating_point()) continue;
      params_.push_back(e.tensor);
      if (scratch_bytes_ < kScratchMax) {
        scratch_.push_back(e.tensor.detach().clone());
        scratch_bytes_ += e.tensor.nbytes();
      }
    }
    // Calibrate: time single passes and optimizer steps, then size the compute.
    Series pass, opt;
    for (int i = 0; i < 5; ++i) {
      auto t0 = Clock::now();
      compute_pass();
      pass.add(since(t0));
      t0 = Clock::now();
      optimizer_step();
      opt.add(since(t0));
    }
    pass_ms_ = pass.median() * 1e3;
    optimizer_ms_ = opt.median() * 1e3;
    passes_ = std::max(
        1, static_cast<int>(std::lround((step_ms - optimizer_ms_) / std::max(pass_ms_, 1e-3))));
  }
  void compute() {
    for (int i = 0; i < passes_; ++i) compute_pass();
  }
  void optimizer_step() {
    for (at::Tensor& t : params_) t.add_(1e-3);
  }
  // Scales the compute so that a step measured at `measured_ms` takes about `target_ms`.
  void rescale(double target_ms, double measured_ms) {
    const double compute_ms = measured_ms - optimizer_ms_;
    if (compute_ms <= 0) return;
    passes_ = std::max(
        1, static_cast<int>(std::lround(passes_ * (target_ms - optimizer_ms_) / compute_ms)));
  }
  int passes() const { return passes_; }
  uint64_t scratch_bytes() const { return scratch_bytes_; }
  double pass_ms() const { return pass_ms_; }
  double optimizer_ms() const { return optimizer_ms_; }

 private:
  void compute_pass() {
    for (at::Tensor& g : scratch_) g.mul_(0.999).add_(1e-6);
  }
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> scratch_;
  uint64_t scratch_bytes_ = 0;
  int passes_ = 1;
  double pass_ms_ = 0, optimizer_ms_ = 0;
};

}  // namespace

Timeline run_timeline(const BenchOptions& o, StateDict& state, const fs::path& work,
                      Progress& progress) {
  // Built first, so that both runs see its threads and staging pool.
  Snapshotter snap(snapshotter_options(o, output_bytes(state, dtype_of(o.dtype)), work));
  progress.show("timeline: calibrating the step...");
  TrainSim sim(state, o.step_ms);
  Timeline tl;
  tl.engine = snap.engine_name();
  tl.every = o.every;
  tl.scratch_bytes = sim.scratch_bytes();
  tl.pass_ms = sim.pass_ms();
  tl.optimizer_ms = sim.optimizer_ms();
  tl.steps.resize(static_cast<size_t>(o.steps));
  for (int round = 0; round < 2; ++round) {  // refine on whole steps, then they are warm
    Series step;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = Clock::now();
      sim.compute();
      sim.optimizer_step();
      step.add(since(t0));
    }
    sim.rescale(o.step_ms, step.median() * 1e3);
  }
  tl.passes = sim.passes();

  // The two runs interleave in blocks of --every steps, so that drift of the machine's speed
  // (other processes, the host) hits both alike: a block without snapshots, then the same
  // steps with a snapshot at the end of the block's first step, whose write overlaps the rest
  // of the block. Between blocks (untimed) the save is waited for and the snapshot before it
  // removed, so no write spills into the next block without snapshots.
  SaveOptions save;
  save.dtype = dtype_of(o.dtype);
  save.staging = o.lazy ? Staging::kLazy : Staging::kEager;
  save.overwrite = true;
  // Warm-up, untimed: a save (whose staging faults in what the pool's background thread has
  // not reached yet: a training loop's first save does that once), then two steps.
  {
    SaveHandle warm = snap.save_async("warm-up", state, nlohmann::json::object(), save);
    warm.wait();
    detail::remove_tree(warm.path().string());
  }
  for (int i = 0; i < 2; ++i) {
    sim.compute();
    sim.optimizer_step();
  }
  std::vector<SaveHandle> handles;  // one per tl.saves entry
  SaveHandle current;               // the newest save
  SaveHandle previous;              // the one before, removed once `current` commits
  for (int begin = 0; begin < o.steps; begin += o.every) {
    const int end = std::min(o.steps, begin + o.every);
    progress.show("timeline: steps " + std::to_string(begin + 1) + "-" + std::to_string(end) + "/" +
                  std::to_string(o.steps) + " without, then with a snapshot");
    for (int i = begin; i < end; ++i) {
      const auto t0 = Clock::now();
      sim.compute();
      sim.optimizer_step();
      tl.steps[static_cast<size_t>(i)].without_s = since(t0);
    }
    bool staged = true;  // lazy: whether `current` was waited staged
    for (int i = begin; i < end; ++i) {
      StepRecord& rec = tl.steps[static_cast<size_t>(i)];
      const auto t0 = Clock::now();
      sim.compute();
      if (!staged) {  // lazy: the tensors are about to change
        const auto ts = Clock::now();
        current.wait_staged();
        const double s = since(ts);
        rec.stall_s += s;
        tl.saves.back().stall_s += s;
        staged = true;
      }
      sim.optimizer_step();
      if (i == begin) {
        const std::string name = "step-" + std::to_string(i + 1);
        const auto ts = Clock::now();
        current = snap.save_async(name, state, nlohmann::json{{"step", i + 1}}, save);
        const double s = since(ts);
        rec.stall_s += s;
        rec.snapshot = true;
        handles.push_back(current);
        staged = !o.lazy;
        tl.saves.push_back({name, i + 1, s, 0, 0});
      }
      rec.with_s = since(t0);
      rec.in_flight = !current.done();
    }
    if (!staged) {  // a one-step block: its staging after the step (counted in its stall)
      const auto ts = Clock::now();
      current.wait_staged();
      tl.saves.back().stall_s += since(ts);
    }
    current.wait();
    if (previous.valid()) detail::remove_tree(previous.path().string());
    previous = current;
  }
  for (size_t k = 0; k < handles.size(); ++k) {
    const SaveStats st = handles[k].stats();
    tl.saves[k].durable_s = st.total_s;
    tl.saves[k].bytes = st.bytes;
  }
  if (previous.valid()) detail::remove_tree(previous.path().string());
  return tl;
}

}  // namespace tsnap::bench
