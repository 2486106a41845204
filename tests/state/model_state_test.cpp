// tsnap::model_state and tsnap::apply_model_state on nn and TorchScript modules.

#include "tsnap/model_state.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>

#include "state/nets.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/save.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::clone;
using test_support::Net;
using test_support::same_tensors;
using test_support::TempDir;

const std::vector<std::string> kNetKeys = {"bn.bias",         "bn.num_batches_tracked",
                                           "bn.running_mean", "bn.running_var",
                                           "bn.weight",       "conv.weight",
                                           "emb.weight",      "fc.bias",
                                           "fc.weight"};

TEST(ModelState, TakesParametersAndBuffersByReference) {
  Net net;
  const StateDict state = model_state(*net);
  EXPECT_EQ(state.keys(), kNetKeys);
  EXPECT_TRUE(state.at("fc.weight").is_same(net->fc->weight));
  EXPECT_TRUE(state.at("bn.running_mean").is_same(net->bn->running_mean));
  for (const auto& [key, entry] : state) {
    EXPECT_FALSE(entry.dtype.has_value()) << key;
    EXPECT_FALSE(entry.shard.has_value()) << key;
  }
}

TEST(ModelState, SubmodulesHaveTheirOwnNames) {
  Net net;
  const StateDict sub = model_state(*net->bn);
  EXPECT_EQ(sub.keys(), (std::vector<std::string>{"bias", "num_batches_tracked", "running_mean",
                                                  "running_var", "weight"}));
}

TEST(ModelState, DtypeAppliesToFloatingTensorsOnly) {
  Net net;
  const StateDict state = model_state(*net, {.dtype = at::kBFloat16});
  for (const auto& [key, entry] : state) {
    if (key == "bn.num_batches_tracked") {
      EXPECT_FALSE(entry.dtype.has_value());
    } else {
      EXPECT_EQ(entry.dtype, at::kBFloat16) << key;
    }
    EXPECT_EQ(entry.tensor.scalar_type(), key == "bn.num_batches_tracked" ? at::kLong : at::kFloat)
        << "model_state never converts: " << key;
  }
  EXPECT_THROW(model_state(*net, {.dtype = at::kLong}), InvalidArgument);
  EXPECT_THROW(model_state(*net, {.dtype = at::kBool}), InvalidArgument);
}

TEST(ModelState, IntegerBuffersKeepTheirDtypeThroughABf16Save) {
  TempDir dir;
  Net net;
  net->bn->num_batches_tracked.fill_(123456789);  // not representable in bf16
  save(dir / "s", model_state(*net, {.dtype = at::kBFloat16}));
  const Manifest manifest = read_manifest(dir / "s");
  for (const auto& t : manifest.tensors) {
    EXPECT_EQ(t.dtype, t.name == "bn.num_batches_tracked" ? at::kLong : at::kBFloat16) << t.name;
  }
  Net other;
  apply_model_state(*other, load(dir / "s"));
  EXPECT_EQ(other->bn->num_batches_tracked.item<int64_t>(), 123456789);
  EXPECT_EQ(other->fc->weight.scalar_type(), at::kFloat);
  EXPECT_TRUE(bitwise_equal(other->fc->weight, net->fc->weight.to(at::kBFloat16).to(at::kFloat)));
}

TEST(ModelState, IncludeAndExcludeGlobs) {
  Net net;
  EXPECT_EQ(model_state(*net, {.include = {"conv.*", "*.running_?ar"}}).keys(),
            (std::vector<std::string>{"bn.running_var", "conv.weight"}));
  EXPECT_EQ(model_state(*net, {.exclude = {"bn.*", "*.bias"}}).keys(),
            (std::vector<std::string>{"conv.weight", "emb.weight", "fc.weight"}));
  EXPECT_EQ(model_state(*net, {.include = {"[ef]*.weight"}}).keys(),
            (std::vector<std::string>{"emb.weight", "fc.weight"}));
  EXPECT_THROW(model_state(*net, {.include = {"a"}, .exclude = {"b"}}), InvalidArgument);
}

TEST(ModelState, StrictSelectionRejectsAPatternMatchingNothing) {
  Net net;
  EXPECT_EQ(model_state(*net, {.include = {"fc.*", "decoder.*"}}).size(), 2u);
  try {
    model_state(*net, {.include = {"fc.*", "decoder.*"}, .strict = true});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.code(), ErrorCode::kKeyNotFound);
    EXPECT_NE(std::string(e.what()).find("decoder.*"), std::string::npos);
  }
}

TEST(ModelState, FrozenParametersCanBeSkippedButBuffersStay) {
  Net net;
  net->emb->weight.set_requires_grad(false);
  EXPECT_TRUE(model_state(*net).contains("emb.weight"));
  const StateDict trainable = model_state(*net, {.frozen = false});
  EXPECT_FALSE(trainable.contains("emb.weight"));
  EXPECT_TRUE(trainable.contains("bn.running_mean"));
  EXPECT_EQ(trainable.size(), kNetKeys.size() - 1);
}

TEST(ModelState, ShardsSplitAlongADimensionAndApplyBackIntoTheirPiece) {
  TempDir dir;
  Net net;
  const int world = 3;
  for (int rank = 0; rank < world; ++rank) {
    const StateDict piece = model_state(*net, {.shard = {.rank = rank, .world_size = world}});
    EXPECT_EQ(piece.keys(), kNetKeys);
    // fc.weight is [2, 52]: ranks get 1, 1 and 0 rows.
    const StateEntry& fc = piece.entry("fc.weight");
    ASSERT_TRUE(fc.shard.has_value());
    EXPECT_EQ(fc.shard->global_shape, (std::vector<int64_t>{2, 52}));
    EXPECT_EQ(fc.shard->offsets, (std::vector<int64_t>{std::min(rank, 2), 0}));
    EXPECT_EQ(fc.tensor.size(0), rank < 2 ? 1 : 0);
    // conv.weight is [3, 1, 3, 3]: one filter each.
    EXPECT_TRUE(bitwise_equal(piece.at("conv.weight"), net->conv->weight.narrow(0, rank, 1)));
    // 0-d buffers are replicated whole.
    EXPECT_FALSE(piece.entry("bn.num_batches_tracked").shard.has_value());
    save(dir / ("rank" + std::to_string(rank)), piece);
  }
  Net other;
  for (int rank = 0; rank < world; ++rank) {
    const StateDict back = load(dir / ("rank" + std::to_string(rank)));
    ASSERT_TRUE(back.entry("fc.weight").shard.has_value());
    EXPECT_TRUE(apply_model_state(*other, back).ok());
  }
  EXPECT_TRUE(same_tensors(*net, *other));
}

TEST(ModelState, ShardsAlongALaterDimension) {
  Net net;
  const StateDict piece = model_state(*net, {.shard = {.rank = 1, .world_size = 2, .dim = 1}});
  EXPECT_TRUE(bitwise_equal(piece.at("fc.weight"), net->fc->weight.narrow(1, 26, 26)));
  EXPECT_FALSE(piece.entry("fc.bias").shard.has_value());  // 1-d: replicated
  EXPECT_EQ(piece.entry("emb.weight").shard->offsets, (std::vector<int64_t>{0, 2}));
  Net other;
  other->fc->weight.data().zero_();
  apply_model_state(*other, clone(piece));
  EXPECT_TRUE(bitwise_equal(other->fc->weight.narrow(1, 26, 26), piece.at("fc.weight")));
  EXPECT_TRUE(other->fc->weight.narrow(1, 0, 26).eq(0).all().item<bool>());
  EXPECT_THROW(model_state(*net, {.shard = {.rank = 2, .world_size = 2}}), InvalidArgument);
  EXPECT_THROW(model_state(*net, {.shard = {.rank = 0, .world_size = 0}}), InvalidArgument);
}

TEST(ApplyModelState, CopiesInPlaceConvertingTheDtypeBack) {
  Net net, other;
  StateDict state = clone(model_state(*net));
  state.set("fc.weight", state.at("fc.weight").to(at::kBFloat16));
  const void* storage = other->fc->weight.data_ptr();
  const ApplyReport report = apply_model_state(*other, state);
  EXPECT_TRUE(report.ok()) << report.to_string();
  EXPECT_EQ(report.applied, kNetKeys);
  EXPECT_EQ(other->fc->weight.data_ptr(), storage);
  EXPECT_EQ(other->fc->weight.scalar_type(), at::kFloat);
  EXPECT_TRUE(other->fc->weight.requires_grad());
  EXPECT_TRUE(bitwise_equal(other->fc->weight, net->fc->weight.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(bitwise_equal(other->conv->weight, net->conv->weight));
}

// A state with one key missing, one unexpected and one of the wrong shape.
StateDict broken_state(const Net& net) {
  StateDict state = clone(model_state(*net));
  state.erase("fc.bias");
  state.insert("fc.extra", at::ones({2}));
  state.set("conv.weight", at::ones({3, 1, 2, 2}));
  return state;
}

TEST(ApplyModelState, StrictFailureListsEveryProblemAndChangesNothing) {
  Net net, other;
  const StateDict before = clone(model_state(*other));
  try {
    apply_model_state(*other, broken_state(net));
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShapeMismatch);
    const std::string what = e.what();
    for (const char* key : {"fc.bias", "fc.extra", "conv.weight", "[3, 1, 2, 2]"}) {
      EXPECT_NE(what.find(key), std::string::npos) << key << " not in: " << what;
    }
  }
  for (const auto& [key, entry] : before) {
    EXPECT_TRUE(bitwise_equal(entry.tensor, model_state(*other).at(key))) << key << " changed";
  }
}

TEST(ApplyModelState, NonStrictAppliesWhatFitsAndReportsTheRest) {
  Net net, other;
  const at::Tensor old_bias = other->fc->bias.detach().clone();
  const at::Tensor old_conv = other->conv->weight.detach().clone();
  const ApplyReport report = apply_model_state(*other, broken_state(net), {.strict = false});
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(report.missing, (std::vector<std::string>{"fc.bias"}));
  EXPECT_EQ(report.unexpected, (std::vector<std::string>{"fc.extra"}));
  ASSERT_EQ(report.mismatched.size(), 1u);
  EXPECT_EQ(report.mismatched[0].key, "conv.weight");
  EXPECT_EQ(report.applied.size(), kNetKeys.size() - 2);
  EXPECT_TRUE(bitwise_equal(other->fc->weight, net->fc->weight));
  EXPECT_TRUE(bitwise_equal(other->fc->bias, old_bias));
  EXPECT_TRUE(bitwise_equal(other->conv->weight, old_conv));
}

TEST(ApplyModelState, AnIntegerTensorDoesNotFitAFloatingParameter) {
  Net net;
  StateDict state = clone(model_state(*net));
  state.set("fc.bias", at::zeros({2}, at::kLong));
  const ApplyReport report = apply_model_state(*net, state, {.strict = false});
  ASSERT_EQ(report.mismatched.size(), 1u);
  EXPECT_NE(report.mismatched[0].reason.find("dtype"), std::string::npos);
}

// A TorchScript module with a parameter, a buffer and a submodule, built without a script file.
torch::jit::Module make_jit(double seed) {
  torch::jit::Module inner("Inner");
  inner.register_parameter("bias", at::full({3}, seed), /*is_buffer=*/false);
  torch::jit::Module outer("Outer");
  outer.register_parameter("weight", at::arange(6, at::kFloat).reshape({2, 3}) * seed, false);
  outer.register_buffer("steps", at::full({}, static_cast<int64_t>(seed), at::kLong));
  outer.register_module("inner", inner);
  return outer;
}

TEST(ModelState, TorchScriptModules) {
  const torch::jit::Module a = make_jit(2), b = make_jit(5);
  const StateDict state = model_state(a, {.dtype = at::kHalf});
  EXPECT_EQ(state.keys(), (std::vector<std::string>{"inner.bias", "steps", "weight"}));
  EXPECT_EQ(state.entry("weight").dtype, at::kHalf);
  EXPECT_FALSE(state.entry("steps").dtype.has_value());
  EXPECT_EQ(model_state(a, {.exclude = {"inner.*"}}).keys(),
            (std::vector<std::string>{"steps", "weight"}));

  TempDir dir;
  save(dir / "jit", state);
  EXPECT_TRUE(apply_model_state(b, load(dir / "jit")).ok());
  const StateDict after = model_state(b);
  EXPECT_TRUE(bitwise_equal(after.at("weight"), a.attr("weight").toTensor()));
  EXPECT_EQ(after.at("steps").item<int64_t>(), 2);
  EXPECT_TRUE(bitwise_equal(after.at("inner.bias"), at::full({3}, 2.0)));
}

}  // namespace
}  // namespace tsnap
