#include "bench/workloads.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace tsnap::bench {
namespace {

at::Tensor filled(std::initializer_list<int64_t> shape) {
  // Random values (not zeros) so that nothing downstream can shortcut the bytes.
  return at::randn(shape, at::TensorOptions().dtype(at::kFloat));
}

// GPT-2 small's parameters, with their two Adam moments when `adam`.
StateDict gpt2_small(double scale, bool adam) {
  at::manual_seed(0);
  const int64_t d = std::max<int64_t>(64, static_cast<int64_t>(768 * scale));
  const int64_t vocab = std::max<int64_t>(256, static_cast<int64_t>(50257 * scale));
  StateDict sd;
  const auto add_param = [&](const std::string& name, std::initializer_list<int64_t> shape) {
    sd.insert("model." + name, filled(shape));
    if (!adam) return;
    sd.insert("optim." + name + ".exp_avg", filled(shape));
    sd.insert("optim." + name + ".exp_avg_sq", filled(shape));
  };
  add_param("wte.weight", {vocab, d});
  add_param("wpe.weight", {1024, d});
  for (int l = 0; l < 12; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    add_param(p + "ln_1.weight", {d});
    add_param(p + "ln_1.bias", {d});
    add_param(p + "attn.c_attn.weight", {d, 3 * d});
    add_param(p + "attn.c_attn.bias", {3 * d});
    add_param(p + "attn.c_proj.weight", {d, d});
    add_param(p + "attn.c_proj.bias", {d});
    add_param(p + "ln_2.weight", {d});
    add_param(p + "ln_2.bias", {d});
    add_param(p + "mlp.c_fc.weight", {d, 4 * d});
    add_param(p + "mlp.c_fc.bias", {4 * d});
    add_param(p + "mlp.c_proj.weight", {4 * d, d});
    add_param(p + "mlp.c_proj.bias", {d});
  }
  add_param("ln_f.weight", {d});
  add_param("ln_f.bias", {d});
  return sd;
}

}  // namespace

StateDict gpt2_small_with_adam(double scale) { return gpt2_small(scale, true); }

FineTuning gpt2_fine_tuning(double scale) {
  FineTuning out;
  out.state = gpt2_small(scale, false);
  // The head and its two moments are 10 % of the bytes: 3h = (F + 3h) / 10, h = F / 27.
  const int64_t d = std::max<int64_t>(64, static_cast<int64_t>(768 * scale));
  const int64_t width = std::max<int64_t>(1, static_cast<int64_t>(out.state.nbytes() / 27 / 4 / d));
  for (const char* key :
       {"model.head.weight", "optim.head.weight.exp_avg", "optim.head.weight.exp_avg_sq"}) {
    out.state.insert(key, filled({d, width}));
    out.trained.emplace_back(key);
  }
  out.state.insert("optim.step", at::zeros({}, at::kLong));
  out.trained.emplace_back("optim.step");
  return out;
}

FineTuning interleaved_fine_tuning(double scale) {
  FineTuning out;
  const int64_t d = std::max<int64_t>(64, static_cast<int64_t>(2048 * scale));
  for (int l = 0; l < 8; ++l) {
    const std::string layer = "layers." + std::to_string(l) + ".";
    out.state.insert(layer + "weight", filled({d, d}));
    for (const char* key : {"adapter", "adapter.exp_avg", "adapter.exp_avg_sq"}) {
      out.state.insert(layer + key, filled({d, 64}));
      out.trained.push_back(layer + key);
    }
  }
  out.state.insert("optim.step", at::zeros({}, at::kLong));
  out.trained.emplace_back("optim.step");
  return out;
}

StateDict llama_1b_with_adam(double scale) {
  at::manual_seed(3);
  auto dim = [&](int64_t n, int64_t lo) {
    return std::max<int64_t>(lo, static_cast<int64_t>(n * scale) / 64 * 64);
  };
  const int64_t d = dim(2048, 64), ff = dim(5632, 128), kv = dim(256, 64), vocab = dim(32000, 256);
  StateDict sd;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    sd.insert("model." + name, at::randn(shape));
    sd.insert("optim." + name + ".exp_avg", at::randn(shape));
    sd.insert("optim." + name + ".exp_avg_sq", at::randn(shape));
  };
  add("embed_tokens.weight", {vocab, d});
  for (int l = 0; l < 22; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "self_attn.q_proj.weight", {d, d});
    add(p + "self_attn.k_proj.weight", {kv, d});
    add(p + "self_attn.v_proj.weight", {kv, d});
    add(p + "self_attn.o_proj.weight", {d, d});
    add(p + "mlp.gate_proj.weight", {ff, d});
    add(p + "mlp.up_proj.weight", {ff, d});
    add(p + "mlp.down_proj.weight", {d, ff});
    add(p + "input_layernorm.weight", {d});
    add(p + "post_attention_layernorm.weight", {d});
  }
  add("norm.weight", {d});
  add("lm_head.weight", {vocab, d});
  return sd;
}

StateDict small_tensors(int count) {
  at::manual_seed(1);
  StateDict sd;
  for (int i = 0; i < count; ++i) {
    // 1K..16K floats = 4..64 KiB, spread deterministically.
    const int64_t elems = 1024 + (static_cast<int64_t>(i) * 7919) % (15 * 1024 + 1);
    sd.insert("t." + std::to_string(i), at::randn({elems}));
  }
  return sd;
}

StateDict large_tensors(uint64_t bytes, int count) {
  at::manual_seed(2);
  StateDict sd;
  const int64_t elems = static_cast<int64_t>(bytes / 4 / static_cast<uint64_t>(count));
  for (int i = 0; i < count; ++i) sd.insert("big." + std::to_string(i), at::randn({elems}));
  return sd;
}

Workload make_workload(const std::string& preset, double size, int tensors) {
  if (tensors > 0) {
    const uint64_t bytes = static_cast<uint64_t>(size * 1073741824.0);
    return {large_tensors(bytes, tensors), std::to_string(tensors) + " equal fp32 tensors"};
  }
  if (preset == "small-tensors") {
    const int n = std::max(1, static_cast<int>(10000 * size));
    return {small_tensors(n), std::to_string(n) + " small fp32 tensors (4-64 KiB)"};
  }
  const std::string scale = "(scale " + std::to_string(size).substr(0, 4) + ")";
  if (preset == "llama-1b") {
    return {llama_1b_with_adam(size), "Llama-1B-like + Adam moments " + scale};
  }
  Workload w{gpt2_small_with_adam(size), "GPT-2 small + Adam moments " + scale};
  if (preset == "mixed") {
    const int n = std::max(1, static_cast<int>(2000 * size));
    for (auto& [k, e] : small_tensors(n)) w.state.insert(k, e.tensor);
    w.description += " + " + std::to_string(n) + " small tensors";
  }
  return w;
}

}  // namespace tsnap::bench
