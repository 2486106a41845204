// tsnap::Stateful objects and LR schedulers in checkpoints: saved with the models and optimizers,
// applied first, exact resume of a scheduled run.

#include "tsnap/stateful.h"

#include <gtest/gtest.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <stdexcept>

#include "state/nets.h"
#include "tsnap/checkpoint.h"
#include "tsnap/error.h"

namespace tsnap {
namespace {

using test_support::bitwise_equal;
using test_support::clone;
using test_support::Net;
using test_support::same_tensors;
using test_support::TempDir;
using test_support::train;
namespace optim = torch::optim;

// Where a data loader stands: plain values and a tensor (a shuffled order).
struct DataPosition : Stateful {
  int64_t epoch = 0;
  int64_t batch = 0;
  at::Tensor order = at::randperm(16);

  StatefulState state_dict() const override {
    return {{{"order", order}}, {{"epoch", epoch}, {"batch", batch}}};
  }
  void load_state_dict(const StatefulState& state) override {
    const at::Tensor& saved = state.tensors.at("order");
    if (!saved.sizes().equals(order.sizes())) throw std::invalid_argument("order has another size");
    epoch = state.values.at("epoch");
    batch = state.values.at("batch");
    order.copy_(saved);
  }
};

double lr_of(const optim::Optimizer& optimizer) {
  return optimizer.param_groups().front().options().get_lr();
}

TEST(Stateful, ValuesAndTensorsRoundTripThroughASave) {
  TempDir dir;
  DataPosition data;
  data.epoch = 3;
  data.batch = 41;
  auto shared = std::make_shared<DataPosition>();
  shared->batch = 7;
  save(dir.path() / "c", Checkpoint::of({{"data", data}, {"other", shared}}));

  const Checkpoint loaded = load_checkpoint(dir.path() / "c");
  EXPECT_EQ(loaded.info()["objects"]["data"]["kind"], "stateful");
  EXPECT_EQ(loaded.object("data").values, (nlohmann::json{{"epoch", 3}, {"batch", 41}}));
  EXPECT_TRUE(loaded.state().contains("data/order"));

  DataPosition fresh;
  auto fresh_shared = std::make_shared<DataPosition>();
  const ApplyReport report = loaded.apply({{"data", fresh}, {"other", fresh_shared}});
  EXPECT_EQ(fresh.epoch, 3);
  EXPECT_EQ(fresh.batch, 41);
  EXPECT_TRUE(bitwise_equal(fresh.order, data.order));
  EXPECT_EQ(fresh_shared->batch, 7);
  EXPECT_EQ(report.applied, (std::vector<std::string>{"data/", "other/"}));
}

// Trains with SGD and a StepLR schedule, checkpoints in the middle, and resumes a fresh model,
// optimizer and scheduler: the weights and the learning rate follow the uninterrupted run.
TEST(Stateful, StepLRResumesWhereItStopped) {
  TempDir dir;
  at::manual_seed(1);
  Net net;
  optim::SGD sgd(net->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  optim::StepLR scheduler(sgd, /*step_size=*/3, /*gamma=*/0.5);
  auto run = [](Net& n, optim::Optimizer& o, optim::StepLR& s, int steps) {
    for (int i = 0; i < steps; ++i) {
      train(n, o, 1);
      s.step();
    }
  };
  run(net, sgd, scheduler, 4);
  save(dir.path() / "c", Checkpoint::of({{"model", net},
                                         {"optim", tsnap::bind(sgd, net)},
                                         {"sched", scheduler},
                                         {"rng", rng_state()}}));
  run(net, sgd, scheduler, 5);

  at::manual_seed(2);  // other weights, other random numbers
  Net fresh;
  optim::SGD fresh_sgd(fresh->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  optim::StepLR fresh_scheduler(fresh_sgd, 3, 0.5);
  const Checkpoint loaded = load_checkpoint(dir.path() / "c");
  EXPECT_EQ(loaded.object("sched").values, (nlohmann::json{{"step_count", 4}}));
  loaded.apply({{"model", fresh},
                {"optim", tsnap::bind(fresh_sgd, fresh)},
                {"sched", fresh_scheduler},
                {"rng", rng_state()}});
  EXPECT_DOUBLE_EQ(lr_of(fresh_sgd), 0.05);  // one decay after 3 of the 4 steps
  run(fresh, fresh_sgd, fresh_scheduler, 5);
  EXPECT_DOUBLE_EQ(lr_of(fresh_sgd), lr_of(sgd));
  EXPECT_DOUBLE_EQ(lr_of(sgd), 0.1 * 0.5 * 0.5);  // decayed at step counts 3 and 6
  EXPECT_TRUE(same_tensors(*net, *fresh));
}

TEST(Stateful, SchedulerStateRejectsABadStepCount) {
  at::manual_seed(1);
  Net net;
  optim::SGD sgd(net->parameters(), optim::SGDOptions(0.1));
  optim::StepLR scheduler(sgd, 3, 0.5);
  SchedulerState state(scheduler);
  for (const nlohmann::json& values :
       {nlohmann::json::object(), nlohmann::json{{"step_count", -1}},
        nlohmann::json{{"step_count", "4"}}, nlohmann::json{{"step_count", 1ull << 40}}}) {
    try {
      state.load_state_dict({{}, values});
      FAIL() << "no error for " << values.dump();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("step_count"), std::string::npos) << e.what();
    }
  }
  state.load_state_dict({{}, {{"step_count", 7}}});
  EXPECT_EQ(state.state_dict().values, (nlohmann::json{{"step_count", 7}}));
}

TEST(Stateful, AnObjectTheCheckpointLacksIsMissing) {
  at::manual_seed(1);
  Net net;
  const Checkpoint ckpt = Checkpoint::of({{"model", net}});
  DataPosition data;
  Net fresh;
  const StateDict before = clone(model_state(*fresh));
  try {
    ckpt.apply({{"model", fresh}, {"data", data}});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.code(), ErrorCode::kKeyNotFound);
    EXPECT_NE(std::string(e.what()).find("data/"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(bitwise_equal(fresh->fc->weight, before.at("fc.weight")));
  const ApplyReport report = ckpt.apply({{"model", fresh}, {"data", data}}, {.strict = false});
  EXPECT_EQ(report.missing, (std::vector<std::string>{"data/"}));
  EXPECT_TRUE(same_tensors(*net, *fresh));
}

// A Stateful that refuses its state is loaded before any tensor changes: the model stays as it
// was.
TEST(Stateful, AThrowingObjectLeavesTheModelUnchanged) {
  at::manual_seed(1);
  Net net;
  DataPosition data;
  const Checkpoint ckpt = Checkpoint::of({{"model", net}, {"data", data}});
  Net fresh;
  const StateDict before = clone(model_state(*fresh));
  DataPosition other;
  other.order = at::randperm(8);  // another size: load_state_dict throws
  EXPECT_THROW(ckpt.apply({{"model", fresh}, {"data", other}}), std::invalid_argument);
  for (const auto& [key, entry] : before) {
    EXPECT_TRUE(bitwise_equal(entry.tensor, model_state(*fresh).at(key))) << key;
  }
}

struct BadValues : Stateful {
  StatefulState state_dict() const override { return {{}, nlohmann::json::array({1, 2})}; }
  void load_state_dict(const StatefulState&) override {}
};

TEST(Stateful, ValuesMustBeAnObject) {
  BadValues bad;
  try {
    Checkpoint::of({{"bad", bad}});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'bad'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tsnap
