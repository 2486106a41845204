#pragma once
// Model-shaped benchmark states, shared by bench programs and `tsnap bench`.

#include <cstdint>
#include <string>
#include <vector>

#include "tsnap/state_dict.h"

namespace tsnap::bench {

/// GPT-2 small (124M parameters) with two Adam moments per parameter: ~1.5 GB of fp32.
/// `scale` in (0, 1] shrinks every layer's width-ish dimension for quick runs.
StateDict gpt2_small_with_adam(double scale = 1.0);

/// A fine-tuning state: GPT-2 small's parameters as a frozen backbone (no optimizer state) and
/// a trained head with two Adam moments, the head's three tensors being 10 % of the bytes
/// (~0.55 GB at scale 1). `trained` lists the keys a training step changes.
struct FineTuning {
  StateDict state;
  std::vector<std::string> trained;
};
FineTuning gpt2_fine_tuning(double scale = 1.0);
/// A fine-tune whose frozen and trained tensors interleave by name, as adapters do: 8 frozen
/// layers of [2048, 2048] fp32 (16 MiB each at scale 1) "layers.<i>.weight", each followed
/// by a trained "layers.<i>.adapter" [2048, 64] with its Adam moments, and a step counter.
FineTuning interleaved_fine_tuning(double scale = 1.0);

/// TinyLlama-1.1B-like layer shapes (22 layers, hidden 2048, MLP 5632, 4 KV heads of 64, vocab
/// 32000) with two Adam moments per parameter: ~13 GB of fp32; `scale` shrinks the widths.
StateDict llama_1b_with_adam(double scale = 1.0);

/// `count` tensors of 4-64 KiB each (fp32), deterministic sizes.
StateDict small_tensors(int count);

/// Tensors of about `bytes` in total, in `count` equal fp32 tensors.
StateDict large_tensors(uint64_t bytes, int count);

/// A benchmark state and the words that describe it in reports.
struct Workload {
  StateDict state;
  std::string description;  ///< e.g. "GPT-2 small + Adam moments (scale 1.00)"
};

/// The state of a preset ("gpt2-small", "llama-1b", "small-tensors", "mixed": GPT-2 small plus
/// 2,000 small tensors) at scale `size`, or, when `tensors` > 0, `tensors` equal fp32 tensors of
/// `size` GiB in all. Deterministic.
Workload make_workload(const std::string& preset, double size, int tensors);

}  // namespace tsnap::bench
