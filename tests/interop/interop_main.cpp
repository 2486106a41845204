// Format interoperability between LibTorch builds (scripts/interop.sh): one build writes, the
// other reads. `tsnap_interop write DIR` saves into DIR a plain snapshot (every dtype, bf16/fp16
// conversion, several shards and chunks, user metadata) and a checkpoint (model + Adam after
// three steps + tensors); `tsnap_interop check DIR` loads both, compares every value bit for bit
// with what the writer computed (values made from integer arithmetic, identical on every
// LibTorch), applies the checkpoint strictly to a fresh model and optimizer, and exits 0 only if
// all of it holds. The optimizer's state is compared with the record of it the writer saved as
// plain tensors next to it.

#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/version.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "tsnap/checkpoint.h"
#include "tsnap/load.h"
#include "tsnap/save.h"

namespace {

// n floats from integer arithmetic only: the same bits with every LibTorch and compiler.
at::Tensor values(int64_t n, uint32_t seed) {
  at::Tensor t = at::empty({n}, at::kFloat);
  float* p = t.data_ptr<float>();
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = static_cast<float>(static_cast<int32_t>(x % 2000001u) - 1000000) / 4096.0f;
  }
  return t;
}

tsnap::StateDict plain_state() {
  tsnap::StateDict sd;
  sd.insert("f32.big", values(300 * 1000, 1).view({300, 1000}));
  sd.insert("f32.as_bf16", values(4096, 2), at::kBFloat16);
  sd.insert("f32.as_f16", values(777, 3).view({7, 111}), at::kHalf);
  sd.insert("f64", values(100, 4).to(at::kDouble));
  sd.insert("i64.step", at::scalar_tensor(static_cast<int64_t>(123456789012), at::kLong));
  sd.insert("i32", values(50, 5).to(at::kInt));
  sd.insert("u8", values(64, 6).abs().to(at::kByte));
  sd.insert("bool", values(33, 7).gt(0));
  return sd;
}

struct Net {
  torch::nn::Linear fc{torch::nn::LinearOptions(16, 8)};
  Net() {
    torch::NoGradGuard no_grad;
    fc->weight.copy_(values(16 * 8, 8).view({8, 16}));
    fc->bias.copy_(values(8, 9));
  }
};

tsnap::Checkpoint checkpoint_of(Net& net, torch::optim::Adam& opt) {
  return tsnap::Checkpoint::of({{"model", *net.fc},
                                {"optim", tsnap::bind(opt, *net.fc)},
                                {"extra", tsnap::StateDict{{"x", values(10, 10)}}}},
                               {{"epoch", 7}, {"written_by", TORCH_VERSION}});
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous();
  const at::Tensor cb = b.contiguous();
  // An empty tensor's data_ptr() may be null, and memcmp on null is undefined even for 0 bytes.
  return ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

int fail(const std::string& what) {
  std::cerr << "interop: FAILED: " << what << '\n';
  return 1;
}

int write(const std::filesystem::path& dir) {
  tsnap::save(dir / "plain", plain_state(), {{"torch", TORCH_VERSION}, {"n", {1, 2, 3}}},
              {.num_shards = 3, .chunk_bytes = 64 << 10});
  Net net;
  torch::optim::Adam opt(net.fc->parameters(), torch::optim::AdamOptions(0.01));
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    net.fc->forward(values(16 * 4, 20 + step).view({4, 16})).pow(2).sum().backward();
    opt.step();
  }
  const tsnap::Checkpoint ckpt = checkpoint_of(net, opt);
  tsnap::save(dir / "checkpoint", ckpt);
  // The writer's view of the same state, as plain tensors, for the reader to compare with.
  tsnap::StateDict record;
  for (const auto& [key, entry] : ckpt.state()) record.insert(key, entry.tensor.clone());
  tsnap::save(dir / "checkpoint-record", record);
  std::cout << "interop: wrote " << dir << " with LibTorch " << TORCH_VERSION << '\n';
  return 0;
}

int check(const std::filesystem::path& dir) {
  const tsnap::Manifest manifest = tsnap::read_manifest(dir / "plain");
  const tsnap::StateDict want = plain_state();
  const tsnap::StateDict got = tsnap::load(dir / "plain");
  if (got.keys() != want.keys()) return fail("plain: other keys");
  for (const auto& [key, entry] : want) {
    const at::Tensor expected = entry.dtype ? entry.tensor.to(*entry.dtype) : entry.tensor;
    if (!same(expected, got.at(key))) return fail("plain: '" + key + "' differs");
  }
  tsnap::StateDict into = plain_state();
  for (auto& [key, entry] : into) entry.tensor.zero_();
  tsnap::load_into(dir / "plain", into);
  if (!same(into.at("f32.big"), want.at("f32.big"))) return fail("plain: load_into differs");
  if (manifest.metadata.value("n", nlohmann::json()) != nlohmann::json({1, 2, 3})) {
    return fail("plain: metadata differs");
  }
  if (!tsnap::verify(dir / "plain").empty()) return fail("plain: verify found bad chunks");

  Net net;
  torch::optim::Adam opt(net.fc->parameters(), torch::optim::AdamOptions(0.5));
  const tsnap::Checkpoint ckpt = tsnap::load_checkpoint(dir / "checkpoint");
  tsnap::StateDict extra{{"x", at::zeros({10})}};
  ckpt.apply({{"model", *net.fc}, {"optim", tsnap::bind(opt, *net.fc)}, {"extra", extra}});
  if (ckpt.metadata().value("epoch", 0) != 7) return fail("checkpoint: metadata differs");
  if (!same(extra.at("x"), values(10, 10))) return fail("checkpoint: 'extra/x' differs");
  const auto& options =
      static_cast<const torch::optim::AdamOptions&>(opt.param_groups()[0].options());
  if (options.lr() != 0.01) return fail("checkpoint: Adam's lr was not restored");
  // The restored objects, read back through the writer's API, equal the writer's record.
  const tsnap::StateDict record = tsnap::load(dir / "checkpoint-record");
  const tsnap::Checkpoint now = checkpoint_of(net, opt);
  if (now.state().keys() != record.keys()) return fail("checkpoint: other keys after apply");
  for (const auto& [key, entry] : record) {
    if (!same(now.state().at(key), entry.tensor)) return fail("checkpoint: '" + key + "' differs");
  }
  std::cout << "interop: " << dir << " (written with LibTorch "
            << manifest.metadata.value("torch", std::string("?")) << ") reads back exactly with "
            << "LibTorch " << TORCH_VERSION << '\n';
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "write") != 0 && std::strcmp(argv[1], "check") != 0)) {
    std::cerr << "usage: tsnap_interop write|check DIR\n";
    return 2;
  }
  try {
    return std::strcmp(argv[1], "write") == 0 ? write(argv[2]) : check(argv[2]);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
