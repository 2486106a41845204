// tsnap::optimizer_state and tsnap::apply_optimizer_state for LibTorch's optimizers.

#include "tsnap/optimizer_state.h"

#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "state/nets.h"
#include "state/torch_compat.h"
#include "tsnap/error.h"
#include "tsnap/model_state.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::clone;
using test_support::Net;
using test_support::same_tensors;
using test_support::train;
namespace optim = torch::optim;

OptimizerState copy(const OptimizerState& state) { return {clone(state.state), state.config}; }

TEST(OptimizerState, AdamStateIsKeyedByParameterName) {
  at::manual_seed(0);
  Net net;
  optim::Adam adam(net->parameters(),
                   optim::AdamOptions(0.01).betas(std::make_tuple(0.8, 0.9)).amsgrad(true));
  EXPECT_TRUE(optimizer_state(adam, *net).state.empty());  // no step yet
  train(net, adam, 2);
  const OptimizerState state = optimizer_state(adam, *net);
  for (const char* field : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
    EXPECT_TRUE(state.state.at(std::string("fc.weight/") + field).sizes() ==
                net->fc->weight.sizes())
        << field;
  }
  const at::Tensor& step = state.state.at("fc.bias/step");
  EXPECT_EQ(step.dim(), 0);
  EXPECT_EQ(step.scalar_type(), at::kLong);
  EXPECT_EQ(step.item<int64_t>(), 2);
  EXPECT_EQ(state.state.size(), 6u * 4u);  // 6 parameters, 4 fields each

  const auto& config = state.config;
  EXPECT_EQ(config["type"], "Adam");
  ASSERT_EQ(config["param_groups"].size(), 1u);
  const auto& group = config["param_groups"][0];
  EXPECT_EQ(group["lr"], 0.01);
  EXPECT_EQ(group["betas"], nlohmann::json({0.8, 0.9}));
  EXPECT_EQ(group["amsgrad"], true);
  EXPECT_EQ(group["params"].size(), 6u);
  EXPECT_EQ(config["stateful"].size(), 6u);
}

TEST(OptimizerState, EachTypeNamesItsFields) {
  at::manual_seed(0);
  Net net;
  optim::SGD plain(net->parameters(), optim::SGDOptions(0.1));
  train(net, plain, 1);
  EXPECT_TRUE(optimizer_state(plain, *net).state.empty());  // no momentum, no state

  optim::SGD sgd(net->parameters(), optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  train(net, sgd, 1);
  auto keys = optimizer_state(sgd, *net).state.keys();
  EXPECT_EQ(keys.front(), "bn.bias/momentum_buffer");
  EXPECT_EQ(optimizer_state(sgd, *net).config["param_groups"][0]["nesterov"], true);

  optim::RMSprop rms(net->parameters(), optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
  train(net, rms, 1);
  const StateDict r = optimizer_state(rms, *net).state;
  for (const char* field : {"grad_avg", "momentum_buffer", "square_avg", "step"}) {
    EXPECT_TRUE(r.contains(std::string("fc.bias/") + field)) << field;
  }

  optim::Adagrad adagrad(net->parameters(), optim::AdagradOptions(0.1));
  const StateDict a = optimizer_state(adagrad, *net).state;  // Adagrad makes state up front
  EXPECT_EQ(a.keys().size(), 12u);
  EXPECT_TRUE(a.contains("emb.weight/sum"));
  EXPECT_EQ(a.at("emb.weight/step").item<int64_t>(), 0);

  optim::AdamW adamw(net->parameters(), optim::AdamWOptions(0.01));
  train(net, adamw, 1);
  const OptimizerState w = optimizer_state(adamw, *net);
  EXPECT_EQ(w.config["type"], "AdamW");
  EXPECT_FALSE(w.state.contains("fc.bias/max_exp_avg_sq"));
  EXPECT_EQ(w.config["param_groups"][0]["weight_decay"], 0.01);
}

TEST(OptimizerState, UnsupportedOptimizersAreRejected) {
  Net net;
  optim::LBFGS lbfgs(net->parameters(), optim::LBFGSOptions(1));
  try {
    optimizer_state(lbfgs, *net);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("unsupported optimizer: torch::optim::LBFGS"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(apply_optimizer_state(lbfgs, *net, {}), Error);
}

TEST(OptimizerState, ParametersOutsideTheModuleAreRejected) {
  Net net, other;
  optim::SGD sgd(other->parameters(), optim::SGDOptions(0.1));
  EXPECT_THROW(optimizer_state(sgd, *net), InvalidArgument);
}

// Trains `steps`, snapshots model and optimizer (deep copies), trains `steps` more; then a fresh
// model and optimizer take the snapshot and train the same steps: both must end bitwise equal.
template <class Make>
void expect_exact_resume(Make make) {
  at::manual_seed(0);
  Net net;
  auto opt = make(*net);
  train(net, *opt, 3);
  const StateDict model = clone(model_state(*net));
  const OptimizerState saved = copy(optimizer_state(*opt, *net));
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng = generator.get_state();
  train(net, *opt, 3);

  at::manual_seed(42);
  Net fresh;
  auto fresh_opt = make(*fresh);
  ASSERT_TRUE(apply_model_state(*fresh, model).ok());
  const ApplyReport report = apply_optimizer_state(*fresh_opt, *fresh, saved);
  ASSERT_TRUE(report.ok()) << report.to_string();
  generator.set_state(rng);
  train(fresh, *fresh_opt, 3);
  EXPECT_TRUE(same_tensors(*net, *fresh));
  const StateDict want = optimizer_state(*opt, *net).state;
  const StateDict got = optimizer_state(*fresh_opt, *fresh).state;
  ASSERT_EQ(want.keys(), got.keys());
  for (const auto& [key, entry] : want)
    EXPECT_TRUE(bitwise_equal(entry.tensor, got.at(key))) << key;
}

TEST(ApplyOptimizerState, AdamResumesExactly) {
  expect_exact_resume([](test_support::NetImpl& net) {
    // Two param groups with their own learning rates.
    std::vector<at::Tensor> conv, rest;
    for (const auto& item : net.named_parameters()) {
      (item.key().rfind("conv.", 0) == 0 ? conv : rest).push_back(item.value());
    }
    std::vector<optim::OptimizerParamGroup> groups;
    groups.emplace_back(conv, std::make_unique<optim::AdamOptions>(0.05));
    groups.emplace_back(rest);
    return std::make_unique<optim::Adam>(groups, optim::AdamOptions(0.01).amsgrad(true));
  });
}

TEST(ApplyOptimizerState, SgdWithMomentumResumesExactly) {
  expect_exact_resume([](test_support::NetImpl& net) {
    return std::make_unique<optim::SGD>(net.parameters(),
                                        optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
  });
}

TEST(ApplyOptimizerState, HyperParametersAreRestored) {
  Net net;
  optim::RMSprop rms(net->parameters(), optim::RMSpropOptions(0.01).alpha(0.9));
  train(net, rms, 1);
  const OptimizerState saved = copy(optimizer_state(rms, *net));
  static_cast<optim::RMSpropOptions&>(rms.param_groups()[0].options()).lr(0.5).alpha(0.1);
  ASSERT_TRUE(apply_optimizer_state(rms, *net, saved).ok());
  const auto& options = static_cast<optim::RMSpropOptions&>(rms.param_groups()[0].options());
  EXPECT_EQ(options.lr(), 0.01);
  EXPECT_EQ(options.alpha(), 0.9);
}

TEST(ApplyOptimizerState, ParametersWithoutSavedStateLoseTheirState) {
  Net net;
  optim::Adam adam(net->parameters());
  const OptimizerState empty = copy(optimizer_state(adam, *net));
  train(net, adam, 1);
  ASSERT_FALSE(adam.state().empty());
  EXPECT_TRUE(apply_optimizer_state(adam, *net, empty).ok());
  EXPECT_TRUE(adam.state().empty());
}

TEST(ApplyOptimizerState, StrictFailureChangesNothing) {
  Net net;
  optim::Adam adam(net->parameters(), optim::AdamOptions(0.01));
  train(net, adam, 1);
  OptimizerState saved = copy(optimizer_state(adam, *net));
  saved.state.erase("fc.weight/exp_avg_sq");               // missing
  saved.state.set("fc.bias/exp_avg", at::zeros({5}));      // mismatched
  saved.state.insert("fc.bias/velocity", at::zeros({2}));  // unexpected field
  saved.state.set("bn.bias/step", at::full({}, 99, at::kLong));
  saved.config["param_groups"][0]["lr"] = 1.0;

  Net fresh;
  optim::Adam fresh_adam(fresh->parameters(), optim::AdamOptions(0.01));
  try {
    apply_optimizer_state(fresh_adam, *fresh, saved);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    for (const char* key : {"fc.weight/exp_avg_sq", "fc.bias/exp_avg", "fc.bias/velocity"}) {
      EXPECT_NE(what.find(key), std::string::npos) << key << " not in: " << what;
    }
  }
  EXPECT_TRUE(fresh_adam.state().empty());
  EXPECT_EQ(fresh_adam.param_groups()[0].options().get_lr(), 0.01);

  // Non-strict: every parameter whose state is whole is applied; the two broken ones are not.
  const ApplyReport report = apply_optimizer_state(fresh_adam, *fresh, saved, {.strict = false});
  EXPECT_EQ(report.missing, (std::vector<std::string>{"fc.weight/exp_avg_sq"}));
  EXPECT_EQ(report.unexpected, (std::vector<std::string>{"fc.bias/velocity"}));
  ASSERT_EQ(report.mismatched.size(), 1u);
  EXPECT_EQ(report.mismatched[0].key, "fc.bias/exp_avg");
  EXPECT_EQ(fresh_adam.state().size(), 4u);
  EXPECT_EQ(fresh_adam.param_groups()[0].options().get_lr(), 1.0);
  const auto& bn_bias = static_cast<const optim::AdamParamState&>(*fresh_adam.state().at(
      compat::optimizer_state_key<std::decay_t<decltype(fresh_adam.state())>>(fresh->bn->bias)));
  EXPECT_EQ(bn_bias.step(), 99);
}

TEST(ApplyOptimizerState, AnotherOptimizerTypeIsAMismatch) {
  Net net;
  optim::SGD sgd(net->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  train(net, sgd, 1);
  optim::Adam adam(net->parameters());
  try {
    apply_optimizer_state(adam, *net, optimizer_state(sgd, *net));
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShapeMismatch);
    EXPECT_NE(std::string(e.what()).find("param_groups"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(adam.state().empty());
}

}  // namespace
}  // namespace tsnap
