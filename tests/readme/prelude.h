#pragma once
/// \file
/// What the README's C++ blocks use but do not define: a model, its optimizer and scheduler, a
/// training step, a Snapshotter, a few tensors. The blocks are compiled, never run, so these
/// are declarations; tests/readme/definitions.h defines them for the program that links every
/// block. Generated sources include this file first (scripts/readme_snippets.py).
///
/// No tsnap header here beyond what a declaration below cannot do without: a block that names
/// its own headers is compiled with this file and those headers only (TSNAP_README_WITH_TORCH
/// unset), so a header it forgets fails to compile. Blocks without #include lines continue the
/// README's first block and are compiled with LibTorch (TSNAP_README_WITH_TORCH set).

#include <cstdint>

namespace at {
class Tensor;
}  // namespace at
namespace torch::nn {
class Module;
}  // namespace torch::nn
namespace tsnap {
class Checkpoint;
class Snapshotter;
class StateDict;
}  // namespace tsnap

extern tsnap::Snapshotter snap;  // for blocks that use a Snapshotter without making one
extern tsnap::StateDict state;   // a state dict to save
extern at::Tensor weight, bias;  // "Raw state dicts": a layer's tensors
extern at::Tensor step;          // ... and a step counter kept as a tensor
extern int64_t total;            // how many optimizer steps the training loops run
extern int64_t epoch;            // user metadata

#ifdef TSNAP_README_WITH_TORCH
#include <torch/torch.h>
#include <tsnap/stateful.h>  // DataPosition's base

/// The README's model: any module; the blocks use its parameters and `*model`.
struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 8))) {}
  torch::Tensor forward(torch::Tensor x) { return fc1->forward(x); }
  torch::nn::Linear fc1;
};
TORCH_MODULE(Net);

/// The Stateful that the first block uses before the README defines it (as this one).
struct DataPosition : tsnap::Stateful {
  int64_t epoch = 0, batch = 0;
  tsnap::StatefulState state_dict() const override {
    return {{}, {{"epoch", epoch}, {"batch", batch}}};
  }
  void load_state_dict(const tsnap::StatefulState& s) override {
    epoch = s.values.at("epoch");
    batch = s.values.at("batch");
  }
};

extern Net model;
extern torch::optim::AdamW opt;
extern torch::optim::StepLR sched;
extern DataPosition data;

/// One training step: forward, backward, opt.step(), sched.step(); returns the loss.
at::Tensor train_step();
/// A PeriodicSnapshots hook's make_checkpoint and resume callbacks.
tsnap::Checkpoint make();
void apply(tsnap::Checkpoint& checkpoint);
#else
/// Without LibTorch's nn headers (16 s to parse), the model is a stand-in module holder.
struct Net {
  torch::nn::Module& operator*() const;
};
extern Net model;
#endif
