#pragma once
// A small model (Embedding, Conv2d without bias as usual before BatchNorm2d, Linear), a training
// loop that draws its batches from the global generator, and helpers shared by the state tests.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>

#include "support/test_util.h"
#include "tsnap/state_dict.h"

namespace tsnap::test_support {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : emb(register_module("emb", torch::nn::Embedding(10, 4))),
        conv(register_module(
            "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3).padding(1).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(3))),
        fc(register_module("fc", torch::nn::Linear(3 * 4 * 4 + 4, 2))) {}

  at::Tensor forward(const at::Tensor& images, const at::Tensor& tokens) {
    const at::Tensor x = at::relu(bn(conv(images))).flatten(1);
    return fc(at::cat({x, emb(tokens)}, 1));
  }

  torch::nn::Embedding emb;
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

/// `steps` optimizer steps on batches drawn from the global CPU generator.
inline void train(Net& net, torch::optim::Optimizer& optimizer, int steps) {
  for (int i = 0; i < steps; ++i) {
    const at::Tensor images = at::randn({8, 1, 4, 4});
    const at::Tensor tokens = at::randint(10, {8});
    const at::Tensor target = at::randn({8, 2});
    optimizer.zero_grad();
    const at::Tensor loss = (net->forward(images, tokens) - target).pow(2).mean();
    loss.backward();
    optimizer.step();
  }
}

/// Deep copies of every tensor of `state` (what a save and load give back, without the disk).
inline StateDict clone(const StateDict& state) {
  StateDict out;
  for (const auto& [key, entry] : state) {
    out.insert(key, entry.tensor.detach().clone(), entry.dtype, entry.shard);
  }
  return out;
}

/// Whether every parameter and buffer of `a` and `b` is bitwise equal.
inline ::testing::AssertionResult same_tensors(const torch::nn::Module& a,
                                               const torch::nn::Module& b) {
  const auto ta = a.named_parameters(), tb = b.named_parameters();
  const auto ba = a.named_buffers(), bb = b.named_buffers();
  if (ta.keys() != tb.keys() || ba.keys() != bb.keys()) {
    return ::testing::AssertionFailure() << "different keys";
  }
  for (const auto& item : ta) {
    if (!bitwise_equal(item.value(), tb[item.key()])) {
      return ::testing::AssertionFailure() << "parameter " << item.key() << " differs";
    }
  }
  for (const auto& item : ba) {
    if (!bitwise_equal(item.value(), bb[item.key()])) {
      return ::testing::AssertionFailure() << "buffer " << item.key() << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tsnap::test_support
