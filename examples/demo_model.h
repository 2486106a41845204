#pragma once
// The demos' model and task (examples/train.cpp, examples/train_ddp.cpp): a small transformer
// trained on next-token style prediction over synthetic sequences.

#include <torch/torch.h>

#include <cstdint>

namespace tsnap_demo {

constexpr int64_t kVocab = 64;
constexpr int64_t kSeq = 32;
constexpr int64_t kBatch = 8;
constexpr int64_t kWidth = 128;
constexpr int64_t kHeads = 4;
constexpr int64_t kLayers = 2;
constexpr int64_t kFeedForward = 256;
constexpr uint64_t kSeed = 20240611;

struct TransformerImpl : torch::nn::Module {
  explicit TransformerImpl(double dropout = 0.1)
      : embed(register_module("embed", torch::nn::Embedding(kVocab, kWidth))),
        pos(register_parameter("pos", torch::randn({kSeq, kWidth}) * 0.02)),
        encoder(register_module("encoder",
                                torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(
                                    torch::nn::TransformerEncoderLayerOptions(kWidth, kHeads)
                                        .dim_feedforward(kFeedForward)
                                        .dropout(dropout),
                                    kLayers)))),
        head(register_module("head", torch::nn::Linear(kWidth, kVocab))) {}

  torch::Tensor forward(const torch::Tensor& tokens) {  // [batch, seq] -> [batch, seq, vocab]
    const torch::Tensor x = (embed(tokens) + pos).transpose(0, 1);  // [seq, batch, width]
    return head(encoder(x).transpose(0, 1));
  }

  torch::nn::Embedding embed;
  torch::Tensor pos;
  torch::nn::TransformerEncoder encoder;
  torch::nn::Linear head;
};
TORCH_MODULE(Transformer);

/// A batch of tokens and its targets (the task: predict (token + mirrored token) mod vocab).
/// Drawn from `generator`, or from the global generator when it is undefined.
inline std::pair<torch::Tensor, torch::Tensor> make_batch(
    c10::optional<at::Generator> generator = c10::nullopt) {
  const torch::Tensor tokens = torch::randint(kVocab, {kBatch, kSeq}, generator, torch::kLong);
  return {tokens, (tokens + tokens.flip({1})).remainder(kVocab)};
}

/// Forward and backward on one batch (gradients accumulate); returns the loss.
inline torch::Tensor forward_backward(Transformer& model, const torch::Tensor& tokens,
                                      const torch::Tensor& target) {
  torch::Tensor loss = torch::nn::functional::cross_entropy(
      model->forward(tokens).reshape({-1, kVocab}), target.reshape({-1}));
  loss.backward();
  return loss;
}

/// One optimizer step on a fresh batch from the global generator; returns the loss.
inline float train_step(Transformer& model, torch::optim::Optimizer& optimizer) {
  const auto [tokens, target] = make_batch();
  optimizer.zero_grad();
  const torch::Tensor loss = forward_backward(model, tokens, target);
  optimizer.step();
  return loss.item<float>();
}

inline int64_t parameter_count(const Transformer& model) {
  int64_t n = 0;
  for (const torch::Tensor& p : model->parameters()) n += p.numel();
  return n;
}

}  // namespace tsnap_demo
