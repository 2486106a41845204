// tsnap::Checkpoint: several objects saved, loaded and applied as one; exact training resume.

#include "tsnap/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <chrono>
#include <functional>
#include <ostream>

#include "state/nets.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"
#include "tsnap/optimizer_state.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::clone;
using test_support::Net;
using test_support::NetImpl;
using test_support::same_tensors;
using test_support::TempDir;
using test_support::train;
namespace optim = torch::optim;

constexpr int kSteps = 3;

struct OptimizerCase {
  const char* name;
  std::function<std::unique_ptr<optim::Optimizer>(NetImpl&)> make;
};

void PrintTo(const OptimizerCase& c, std::ostream* out) { *out << c.name; }

const OptimizerCase kOptimizers[] = {
    {"Adam", [](NetImpl& n) { return std::make_unique<optim::Adam>(n.parameters()); }},
    {"AdamAmsgrad",
     [](NetImpl& n) {
       return std::make_unique<optim::Adam>(n.parameters(), optim::AdamOptions(0.01).amsgrad(true));
     }},
    {"AdamW", [](NetImpl& n) { return std::make_unique<optim::AdamW>(n.parameters()); }},
    {"SGD",
     [](NetImpl& n) {
       return std::make_unique<optim::SGD>(n.parameters(),
                                           optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
     }},
    {"RMSprop",
     [](NetImpl& n) {
       return std::make_unique<optim::RMSprop>(
           n.parameters(), optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
     }},
    {"Adagrad",
     [](NetImpl& n) {
       return std::make_unique<optim::Adagrad>(n.parameters(), optim::AdagradOptions(0.05));
     }},
};

// The objects of a training run, as a checkpoint names them.
Checkpoint::Objects objects(Net& net, optim::Optimizer& optimizer) {
  return {{"model", net}, {"optim", tsnap::bind(optimizer, net)}, {"rng", rng_state()}};
}

class Resume : public ::testing::TestWithParam<OptimizerCase> {};

// Trains kSteps, checkpoints to disk, trains kSteps more; a fresh model and optimizer (other
// weights, other random numbers) load and apply the checkpoint and train the same kSteps.
TEST_P(Resume, Fp32SnapshotResumesBitwise) {
  TempDir dir;
  at::manual_seed(0);
  Net net;
  auto opt = GetParam().make(*net);
  train(net, *opt, kSteps);
  save(dir / "ckpt", Checkpoint::of(objects(net, *opt), {{"step", kSteps}}));
  train(net, *opt, kSteps);

  at::manual_seed(99);
  Net fresh;
  auto fresh_opt = GetParam().make(*fresh);
  ASSERT_FALSE(same_tensors(*net, *fresh));
  const Checkpoint loaded = load_checkpoint(dir / "ckpt");
  const ApplyReport report = loaded.apply(objects(fresh, *fresh_opt));
  ASSERT_TRUE(report.ok()) << report.to_string();
  train(fresh, *fresh_opt, kSteps);
  EXPECT_TRUE(same_tensors(*net, *fresh));
}

TEST_P(Resume, Bf16SnapshotResumesWithinBf16Rounding) {
  TempDir dir;
  at::manual_seed(0);
  Net net;
  auto opt = GetParam().make(*net);
  train(net, *opt, kSteps);
  const StateDict at_snapshot = clone(model_state(*net));
  save(dir / "ckpt", Checkpoint::of(objects(net, *opt)), {.dtype = at::kBFloat16});
  train(net, *opt, kSteps);

  at::manual_seed(99);
  Net fresh;
  auto fresh_opt = GetParam().make(*fresh);
  const Checkpoint loaded = load_checkpoint(dir / "ckpt");
  EXPECT_EQ(loaded.state().at("model/fc.weight").scalar_type(), at::kBFloat16);
  EXPECT_EQ(loaded.state().at("model/bn.num_batches_tracked").scalar_type(), at::kLong);
  ASSERT_TRUE(loaded.apply(objects(fresh, *fresh_opt)).ok());
  for (const auto& [key, entry] : model_state(*fresh)) {
    const at::Tensor& want = at_snapshot.at(key);
    EXPECT_EQ(entry.tensor.scalar_type(), want.scalar_type()) << key;
    EXPECT_TRUE(bitwise_equal(entry.tensor, want.is_floating_point()
                                                ? want.to(at::kBFloat16).to(want.scalar_type())
                                                : want))
        << key;
  }
  // Three more steps stay within a few bf16 roundings (values are O(1), bf16 keeps 8 bits).
  train(fresh, *fresh_opt, kSteps);
  for (const auto& [key, entry] : model_state(*net)) {
    const at::Tensor got = model_state(*fresh).at(key);
    EXPECT_TRUE(at::allclose(got, entry.tensor, /*rtol=*/1e-2, /*atol=*/1e-2))
        << key << " max diff " << (got - entry.tensor).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Resume, ::testing::ValuesIn(kOptimizers),
                         [](const auto& info) { return std::string(info.param.name); });

// The precision rule: a bf16 or fp16 snapshot of Adam/AdamW past step 2048 (where a 16-bit float
// stops counting by ones) resumes with the exact step, and trains exactly as a resume from the
// fp32 snapshot whose weights and moments were converted the same way.
struct LowPrecisionCase {
  const char* name;
  at::ScalarType dtype;
  bool adamw;
};
void PrintTo(const LowPrecisionCase& c, std::ostream* out) { *out << c.name; }

class LowPrecisionResume : public ::testing::TestWithParam<LowPrecisionCase> {};

TEST_P(LowPrecisionResume, KeepsTheStepExactAndTrainsAsTheConvertedFp32State) {
  constexpr int kLong = 2100, kMore = 10;
  const LowPrecisionCase& c = GetParam();
  const auto make = [&](NetImpl& n) -> std::unique_ptr<optim::Optimizer> {
    if (c.adamw) return std::make_unique<optim::AdamW>(n.parameters(), optim::AdamWOptions(1e-3));
    return std::make_unique<optim::Adam>(n.parameters(), optim::AdamOptions(1e-3));
  };
  TempDir dir;
  at::manual_seed(0);
  Net net;
  auto opt = make(*net);
  train(net, *opt, kLong);
  save(dir / "low", Checkpoint::of(objects(net, *opt)), {.dtype = c.dtype});
  save(dir / "full", Checkpoint::of(objects(net, *opt)));

  Checkpoint low = load_checkpoint(dir / "low");
  Checkpoint full = load_checkpoint(dir / "full");
  for (auto& [key, entry] : full.state()) {
    const at::Tensor& t = entry.tensor;
    const bool counter =
        t.dim() == 0 || (key.size() >= 5 && key.compare(key.size() - 5, 5, "/step") == 0);
    if (key.rfind("rng/", 0) != 0 && t.is_floating_point() && !counter) {
      full.state().set(key, t.to(c.dtype).to(t.scalar_type()));
    }
    if (counter) {
      EXPECT_EQ(low.state().at(key).scalar_type(), t.scalar_type()) << key;
      EXPECT_TRUE(bitwise_equal(low.state().at(key), t)) << key;
    }
  }
  Net a, b;
  auto opt_a = make(*a), opt_b = make(*b);
  ASSERT_TRUE(low.apply(objects(a, *opt_a)).ok());
  ASSERT_TRUE(full.apply(objects(b, *opt_b)).ok());
  train(a, *opt_a, kMore);
  full.apply({{"rng", rng_state()}}, {.strict = false});  // the same batches for the second run
  train(b, *opt_b, kMore);
  EXPECT_TRUE(same_tensors(*a, *b));
  const OptimizerState sa = optimizer_state(*opt_a, *a);
  EXPECT_EQ(sa.state.at("fc.weight/step").item<int64_t>(), kLong + kMore);
  EXPECT_TRUE(bitwise_equal(sa.state.at("fc.weight/exp_avg"),
                            optimizer_state(*opt_b, *b).state.at("fc.weight/exp_avg")));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LowPrecisionResume,
                         ::testing::Values(LowPrecisionCase{"AdamBf16", at::kBFloat16, false},
                                           LowPrecisionCase{"AdamWBf16", at::kBFloat16, true},
                                           LowPrecisionCase{"AdamWFp16", at::kHalf, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Checkpoint, KeysAreObjectSlashKeyAndReferToTheObjects) {
  Net net;
  optim::Adam adam(net->parameters());
  train(net, adam, 1);
  const at::Tensor extra = at::arange(4);
  const Checkpoint ckpt = Checkpoint::of(
      {{"model", net}, {"optim", tsnap::bind(adam, *net)}, {"values", StateDict{{"x", extra}}}});
  EXPECT_TRUE(ckpt.state().at("model/fc.weight").is_same(net->fc->weight));
  EXPECT_TRUE(ckpt.state().contains("optim/fc.weight/exp_avg"));
  EXPECT_EQ(ckpt.state().at("optim/fc.weight/step").item<int64_t>(), 1);
  EXPECT_TRUE(ckpt.state().at("values/x").is_same(extra));
  EXPECT_EQ(ckpt.object_state("model").keys(), model_state(*net).keys());
  EXPECT_EQ(ckpt.state().size(), model_state(*net).size() + 6 * 3 + 1);
}

TEST(Checkpoint, MetadataAndVersionsRoundTrip) {
  TempDir dir;
  Net net;
  optim::SGD sgd(net->parameters(), optim::SGDOptions(0.125).momentum(0.5));
  const auto before = std::chrono::system_clock::now();
  Checkpoint ckpt = Checkpoint::of(objects(net, sgd), {{"epoch", 3}, {"step", 1200}});
  ckpt.metadata()["note"] = {{"text", "anything JSON"}, {"list", {1, 2.5, nullptr}}};
  const nlohmann::json user = ckpt.metadata();
  save(dir / "ckpt", ckpt);

  const Checkpoint loaded = load_checkpoint(dir / "ckpt");
  EXPECT_EQ(loaded.metadata(), user);
  EXPECT_EQ(loaded.metadata()["epoch"].get<int>(), 3);
  const nlohmann::json& info = loaded.info();
  EXPECT_EQ(info, ckpt.info());
  EXPECT_EQ(info["tsnap_version"], TSNAP_PROJECT_VERSION);
  EXPECT_EQ(info["torch_version"], TORCH_VERSION);
  EXPECT_EQ(info["format_version"], kFormatVersion);
  // The manifest's spelling (format/layout.h): 2026-01-02T03:04:05.678Z
  EXPECT_EQ(info["created"].get<std::string>().size(), 24u);
  const int64_t created = info["created_unix_ns"];
  EXPECT_GE(
      created,
      std::chrono::duration_cast<std::chrono::nanoseconds>(before.time_since_epoch()).count());
  EXPECT_EQ(info["objects"]["model"]["kind"], "module");
  EXPECT_EQ(info["objects"]["rng"]["kind"], "rng");
  const auto& optim_info = info["objects"]["optim"];
  EXPECT_EQ(optim_info["kind"], "optimizer");
  EXPECT_EQ(optim_info["type"], "SGD");
  EXPECT_EQ(optim_info["param_groups"][0]["lr"], 0.125);
  EXPECT_EQ(optim_info["param_groups"][0]["momentum"], 0.5);
  // On disk, tsnap's record sits under its reserved key beside the user's values.
  const Manifest manifest = read_manifest(dir / "ckpt");
  EXPECT_EQ(manifest.metadata["epoch"], 3);
  EXPECT_EQ(manifest.metadata[kCheckpointInfoKey], ckpt.info());
}

TEST(Checkpoint, ReservedKeyNamesAndMetadataTypeAreChecked) {
  Net net;
  EXPECT_THROW(Checkpoint::of({{"model", net}}, {{"tsnap", 1}}), InvalidArgument);
  EXPECT_THROW(Checkpoint::of({{"model", net}}, nlohmann::json::array({1, 2})), InvalidArgument);
  Checkpoint ckpt = Checkpoint::of({{"model", net}});
  ckpt.metadata()[kCheckpointInfoKey] = "mine";
  EXPECT_THROW(ckpt.saved_metadata(), InvalidArgument);
  for (const char* bad : {"", "a/b"}) {
    EXPECT_THROW(Checkpoint::of({{bad, net}}), InvalidArgument) << bad;
  }
  EXPECT_THROW(Checkpoint::of({{"m", net}, {"m", net}}), InvalidArgument);
  EXPECT_THROW(ckpt.apply({{"m", net}, {"m", net}}), InvalidArgument);
}

TEST(Checkpoint, UnsupportedOptimizersAreRejected) {
  Net net;
  optim::LBFGS lbfgs(net->parameters(), optim::LBFGSOptions(1));
  try {
    Checkpoint::of({{"model", net}, {"optim", tsnap::bind(lbfgs, net)}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("unsupported optimizer"), std::string::npos);
  }
}

TEST(Checkpoint, IncludeLoadsAPartAndTheRestStaysAvailable) {
  TempDir dir;
  Net net;
  optim::Adam adam(net->parameters());
  train(net, adam, 1);
  save(dir / "ckpt", Checkpoint::of(objects(net, adam), {{"epoch", 7}}));

  const Checkpoint loaded = load_checkpoint(dir / "ckpt", {.include = {"model/*"}});
  EXPECT_EQ(loaded.state().size(), model_state(*net).size());
  Net fresh;
  EXPECT_TRUE(loaded.apply({{"model", fresh}}).ok());
  EXPECT_TRUE(same_tensors(*net, *fresh));
  EXPECT_EQ(loaded.metadata()["epoch"], 7);
  // The optimizer's state was not loaded: under strict, applying it is an error.
  optim::Adam fresh_adam(fresh->parameters());
  EXPECT_THROW(loaded.apply({{"optim", tsnap::bind(fresh_adam, fresh)}}), InvalidArgument);
  EXPECT_TRUE(fresh_adam.state().empty());
}

TEST(Checkpoint, ObjectsNotNamedInApplyAreLeftAlone) {
  Net net, fresh;
  optim::Adam adam(net->parameters());
  train(net, adam, 1);
  const Checkpoint ckpt = Checkpoint::of(objects(net, adam));
  const ApplyReport report = ckpt.apply({{"model", fresh}});
  EXPECT_TRUE(report.ok()) << report.to_string();
  EXPECT_EQ(report.applied.size(), model_state(*net).size());
  EXPECT_EQ(report.applied.front(), "model/bn.bias");
}

// A loaded checkpoint with a missing key, an unexpected key and mismatches in two objects.
Checkpoint broken_checkpoint(const TempDir& dir) {
  Net net;
  optim::Adam adam(net->parameters());
  train(net, adam, 1);
  save(dir / "ckpt", Checkpoint::of(objects(net, adam)));
  Checkpoint loaded = load_checkpoint(dir / "ckpt");
  loaded.state().erase("model/fc.bias");
  loaded.state().insert("model/decoder.weight", at::ones({2}));
  loaded.state().set("model/conv.weight", at::ones({3, 1, 2, 2}));
  loaded.state().set("optim/emb.weight/exp_avg", at::ones({2, 2}));
  return loaded;
}

TEST(Checkpoint, StrictApplyFailsOnAnyProblemAndChangesNothing) {
  TempDir dir;
  const Checkpoint loaded = broken_checkpoint(dir);
  at::manual_seed(5);
  Net fresh;
  optim::Adam fresh_adam(fresh->parameters());
  const StateDict before = clone(model_state(*fresh));
  const RngState rng_before = rng_state();
  try {
    loaded.apply(objects(fresh, fresh_adam));
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShapeMismatch);
    const std::string what = e.what();
    for (const char* key : {"model/fc.bias", "model/decoder.weight", "model/conv.weight",
                            "optim/emb.weight/exp_avg"}) {
      EXPECT_NE(what.find(key), std::string::npos) << key << " not in: " << what;
    }
  }
  for (const auto& [key, entry] : before) {
    EXPECT_TRUE(bitwise_equal(entry.tensor, model_state(*fresh).at(key))) << key << " changed";
  }
  EXPECT_TRUE(fresh_adam.state().empty());
  EXPECT_TRUE(bitwise_equal(rng_state().generators.at("cpu"), rng_before.generators.at("cpu")));
}

TEST(Checkpoint, NonStrictApplyReportsAndAppliesTheRest) {
  TempDir dir;
  const Checkpoint loaded = broken_checkpoint(dir);
  Net fresh;
  optim::Adam fresh_adam(fresh->parameters());
  const ApplyReport report = loaded.apply(objects(fresh, fresh_adam), {.strict = false});
  EXPECT_EQ(report.missing, (std::vector<std::string>{"model/fc.bias"}));
  EXPECT_EQ(report.unexpected, (std::vector<std::string>{"model/decoder.weight"}));
  ASSERT_EQ(report.mismatched.size(), 2u);
  EXPECT_EQ(report.mismatched[0].key, "model/conv.weight");
  EXPECT_EQ(report.mismatched[1].key, "optim/emb.weight/exp_avg");
  EXPECT_TRUE(bitwise_equal(fresh->fc->weight, loaded.state().at("model/fc.weight")));
  EXPECT_EQ(fresh_adam.state().size(), 5u);  // all but emb.weight
  EXPECT_TRUE(bitwise_equal(rng_state().generators.at("cpu"), loaded.state().at("rng/cpu")));
}

TEST(Checkpoint, RandomGeneratorsAreRestored) {
  at::manual_seed(3);
  const Checkpoint ckpt = Checkpoint::of({{"rng", rng_state()}});
  const at::Tensor first = at::randn({5});
  at::randn({100});
  ASSERT_TRUE(ckpt.apply({{"rng", rng_state()}}).ok());
  EXPECT_TRUE(bitwise_equal(at::randn({5}), first));
  EXPECT_THROW(set_rng_state({StateDict{{"cpu", at::zeros({3}, at::kByte)}}}), InvalidArgument);
}

TEST(Checkpoint, TensorsAndTorchScriptModulesRoundTrip) {
  TempDir dir;
  torch::jit::Module jit("Tiny");
  jit.register_parameter("w", at::arange(4, at::kFloat), /*is_buffer=*/false);
  const at::Tensor counter = at::full({}, 41, at::kLong);
  save(dir / "ckpt", Checkpoint::of({{"jit", jit}, {"values", StateDict{{"counter", counter}}}}));

  torch::jit::Module other("Tiny");
  other.register_parameter("w", at::zeros({4}), false);
  const at::Tensor other_counter = at::zeros({}, at::kLong);
  const Checkpoint loaded = load_checkpoint(dir / "ckpt");
  EXPECT_EQ(loaded.info()["objects"]["jit"]["kind"], "jit_module");
  ASSERT_TRUE(
      loaded.apply({{"jit", other}, {"values", StateDict{{"counter", other_counter}}}}).ok());
  EXPECT_TRUE(bitwise_equal(other.attr("w").toTensor(), at::arange(4, at::kFloat)));
  EXPECT_EQ(other_counter.item<int64_t>(), 41);
}

TEST(Checkpoint, SnapshotterSavesACheckpoint) {
  TempDir dir;
  Net net;
  optim::Adam adam(net->parameters());
  train(net, adam, 1);
  Snapshotter snap(
      {.root = dir.path(), .chunk_bytes = 1 << 20, .staging = {.budget_bytes = 8 << 20}});
  snap.save_async("step-1", Checkpoint::of(objects(net, adam), {{"step", 1}})).wait();
  const Checkpoint loaded = load_checkpoint(dir / "step-1");
  EXPECT_EQ(loaded.metadata()["step"], 1);
  Net fresh;
  optim::Adam fresh_adam(fresh->parameters());
  EXPECT_TRUE(loaded.apply(objects(fresh, fresh_adam)).ok());
  EXPECT_TRUE(same_tensors(*net, *fresh));
}

}  // namespace
}  // namespace tsnap
