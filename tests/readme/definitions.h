#pragma once
/// \file
/// Defines what tests/readme/prelude.h declares, so that the program of the README's blocks
/// links (it is never run). Included after every block, so it hides no missing include.

#include <tsnap/tsnap.h>

tsnap::Snapshotter snap({.root = "runs/exp1"});
tsnap::StateDict state;
at::Tensor weight, bias, step;
int64_t total = 0;
int64_t epoch = 0;
Net model;
torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4));
torch::optim::StepLR sched(opt, /*step_size=*/1000, /*gamma=*/0.5);
DataPosition data;

at::Tensor train_step() {
  opt.zero_grad();
  at::Tensor loss = model(torch::randn({4, 8})).square().mean();
  loss.backward();
  opt.step();
  sched.step();
  return loss;
}
tsnap::Checkpoint make() {
  return tsnap::Checkpoint::of({{"model", model}, {"optim", tsnap::bind(opt, model)}});
}
void apply(tsnap::Checkpoint& checkpoint) {
  checkpoint.apply({{"model", model}, {"optim", tsnap::bind(opt, model)}});
}
