#include "tsnap/optimizer_state.h"

#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <set>
#include <typeinfo>
#include <unordered_map>

#include "state/apply.h"
#include "state/torch_compat.h"
#include "tsnap/error.h"

namespace tsnap {
namespace {

namespace optim = torch::optim;
using nlohmann::json;

// The per-type knowledge: each traits struct names the optimizer, options and param-state types,
// visits the state's tensor fields (`fields`, const or not), says which fields a parameter's
// state has under given options (`required`, "step" included), and converts options to JSON.

template <class Opt, class Options, class State, const char* kTypeName>
struct AdamTraits {
  using Optimizer = Opt;
  using OptionsType = Options;
  using StateType = State;
  static constexpr const char* kName = kTypeName;
  static constexpr bool kHasStep = true;
  template <class S, class Fn>
  static void fields(S& s, Fn&& fn) {
    fn("exp_avg", s.exp_avg());
    fn("exp_avg_sq", s.exp_avg_sq());
    fn("max_exp_avg_sq", s.max_exp_avg_sq());
  }
  template <class S>
  static auto& step(S& s) {
    return s.step();
  }
  static std::vector<std::string> required(const Options& o) {
    std::vector<std::string> r = {"step", "exp_avg", "exp_avg_sq"};
    if (o.amsgrad()) r.push_back("max_exp_avg_sq");
    return r;
  }
  static json to_json(const Options& o) {
    return {{"lr", o.lr()},
            {"betas", {std::get<0>(o.betas()), std::get<1>(o.betas())}},
            {"eps", o.eps()},
            {"weight_decay", o.weight_decay()},
            {"amsgrad", o.amsgrad()}};
  }
  static void from_json(const json& j, Options& o) {
    o.lr(j.at("lr").get<double>());
    o.betas(std::make_tuple(j.at("betas").at(0).get<double>(), j.at("betas").at(1).get<double>()));
    o.eps(j.at("eps").get<double>());
    o.weight_decay(j.at("weight_decay").get<double>());
    o.amsgrad(j.at("amsgrad").get<bool>());
  }
};

constexpr char kAdam[] = "Adam";
constexpr char kAdamW[] = "AdamW";
using Adam = AdamTraits<optim::Adam, optim::AdamOptions, optim::AdamParamState, kAdam>;
using AdamW = AdamTraits<optim::AdamW, optim::AdamWOptions, optim::AdamWParamState, kAdamW>;

struct Sgd {
  using Optimizer = optim::SGD;
  using OptionsType = optim::SGDOptions;
  using StateType = optim::SGDParamState;
  static constexpr const char* kName = "SGD";
  static constexpr bool kHasStep = false;
  template <class S, class Fn>
  static void fields(S& s, Fn&& fn) {
    fn("momentum_buffer", s.momentum_buffer());
  }
  static std::vector<std::string> required(const OptionsType& o) { return {"momentum_buffer"}; }
  static json to_json(const OptionsType& o) {
    return {{"lr", o.lr()},
            {"momentum", o.momentum()},
            {"dampening", o.dampening()},
            {"weight_decay", o.weight_decay()},
            {"nesterov", o.nesterov()}};
  }
  static void from_json(const json& j, OptionsType& o) {
    o.lr(j.at("lr").get<double>());
    o.momentum(j.at("momentum").get<double>());
    o.dampening(j.at("dampening").get<double>());
    o.weight_decay(j.at("weight_decay").get<double>());
    o.nesterov(j.at("nesterov").get<bool>());
  }
};

struct RmsProp {
  using Optimizer = optim::RMSprop;
  using OptionsType = optim::RMSpropOptions;
  using StateType = optim::RMSpropParamState;
  static constexpr const char* kName = "RMSprop";
  static constexpr bool kHasStep = true;
  template <class S, class Fn>
  static void fields(S& s, Fn&& fn) {
    fn("square_avg", s.square_avg());
    fn("momentum_buffer", s.momentum_buffer());
    fn("grad_avg", s.grad_avg());
  }
  template <class S>
  static auto& step(S& s) {
    return s.step();
  }
  static std::vector<std::string> required(const OptionsType& o) {
    std::vector<std::string> r = {"step", "square_avg"};
    if (o.momentum() > 0) r.push_back("momentum_buffer");
    if (o.centered()) r.push_back("grad_avg");
    return r;
  }
  static json to_json(const OptionsType& o) {
    return {{"lr", o.lr()},
            {"alpha", o.alpha()},
            {"eps", o.eps()},
            {"weight_decay", o.weight_decay()},
            {"momentum", o.momentum()},
            {"centered", o.centered()}};
  }
  static void from_json(const json& j, OptionsType& o) {
    o.lr(j.at("lr").get<double>());
    o.alpha(j.at("alpha").get<double>());
    o.eps(j.at("eps").get<double>());
    o.weight_decay(j.at("weight_decay").get<double>());
    o.momentum(j.at("momentum").get<double>());
    o.centered(j.at("centered").get<bool>());
  }
};

struct Adagrad {
  using Optimizer = optim::Adagrad;
  using OptionsType = optim::AdagradOptions;
  using StateType = optim::AdagradParamState;
  static constexpr const char* kName = "Adagrad";
  static constexpr bool kHasStep = true;
  template <class S, class Fn>
  static void fields(S& s, Fn&& fn) {
    fn("sum", s.sum());
  }
  template <class S>
  static auto& step(S& s) {
    return s.step();
  }
  static std::vector<std::string> required(const OptionsType&) { return {"step", "sum"}; }
  static json to_json(const OptionsType& o) {
    return {{"lr", o.lr()},
            {"lr_decay", o.lr_decay()},
            {"weight_decay", o.weight_decay()},
            {"initial_accumulator_value", o.initial_accumulator_value()},
            {"eps", o.eps()}};
  }
  static void from_json(const json& j, OptionsType& o) {
    o.lr(j.at("lr").get<double>());
    o.lr_decay(j.at("lr_decay").get<double>());
    o.weight_decay(j.at("weight_decay").get<double>());
    o.initial_accumulator_value(j.at("initial_accumulator_value").get<double>());
    o.eps(j.at("eps").get<double>());
  }
};

using Emit = std::function<void(const char* field, const at::Tensor& tensor)>;

// One supported optimizer type, behind a virtual interface over the traits above.
class Kind {
 public:
  virtual ~Kind() = default;
  virtual const char* name() const = 0;
  virtual bool is(const optim::Optimizer& optimizer) const = 0;
  // The defined fields of a parameter's state; "step" as a 0-d int64 tensor.
  virtual void read(const optim::OptimizerParamState& state, const Emit& emit) const = 0;
  // The fields a parameter's state has under `options`.
  virtual std::vector<std::string> required(const optim::OptimizerOptions& options) const = 0;
  // Every field a parameter's state may have.
  virtual std::vector<std::string> known() const = 0;
  virtual json options_json(const optim::OptimizerOptions& options) const = 0;
  // A copy of `current` with the hyper-parameters of `j`; throws json::exception if malformed.
  virtual std::unique_ptr<optim::OptimizerOptions> parse_options(
      const json& j, const optim::OptimizerOptions& current) const = 0;
  virtual std::unique_ptr<optim::OptimizerParamState> make_state() const = 0;
  // Sets `field` of `state` from `source`: into the existing tensor in place when it fits
  // `param`, else into a new tensor like `param`.
  virtual void set_field(optim::OptimizerParamState& state, const std::string& field,
                         const at::Tensor& source, const at::Tensor& param) const = 0;
};

template <class Traits>
class KindOf final : public Kind {
  using Options = typename Traits::OptionsType;
  using State = typename Traits::StateType;

 public:
  const char* name() const override { return Traits::kName; }
  bool is(const optim::Optimizer& optimizer) const override {
    return dynamic_cast<const typename Traits::Optimizer*>(&optimizer) != nullptr;
  }
  void read(const optim::OptimizerParamState& state, const Emit& emit) const override {
    const State& s = cast(state);
    if constexpr (Traits::kHasStep) emit("step", at::scalar_tensor(Traits::step(s), at::kLong));
    Traits::fields(s, [&](const char* field, const at::Tensor& t) {
      if (t.defined()) emit(field, t);
    });
  }
  std::vector<std::string> required(const optim::OptimizerOptions& options) const override {
    return Traits::required(static_cast<const Options&>(options));
  }
  std::vector<std::string> known() const override {
    std::vector<std::string> names;
    if (Traits::kHasStep) names.push_back("step");
    State s;
    Traits::fields(s, [&](const char* field, const at::Tensor&) { names.push_back(field); });
    return names;
  }
  json options_json(const optim::OptimizerOptions& options) const override {
    return Traits::to_json(static_cast<const Options&>(options));
  }
  std::unique_ptr<optim::OptimizerOptions> parse_options(
      const json& j, const optim::OptimizerOptions& current) const override {
    auto options = current.clone();
    Traits::from_json(j, static_cast<Options&>(*options));
    return options;
  }
  std::unique_ptr<optim::OptimizerParamState> make_state() const override {
    return std::make_unique<State>();
  }
  void set_field(optim::OptimizerParamState& state, const std::string& field,
                 const at::Tensor& source, const at::Tensor& param) const override {
    State& s = cast(state);
    if constexpr (Traits::kHasStep) {
      if (field == "step") {
        Traits::step(s) = source.item<int64_t>();
        return;
      }
    }
    Traits::fields(s, [&](const char* name, at::Tensor& t) {
      if (field != name) return;
      if (t.defined() && t.sizes() == param.sizes() && t.scalar_type() == param.scalar_type() &&
          t.device() == param.device()) {
        t.copy_(source);
      } else {
        t = at::empty_like(param, at::MemoryFormat::Preserve).copy_(source);
      }
    });
  }

 private:
  template <class S>
  static auto& cast(S& state) {
    using Target = std::conditional_t<std::is_const_v<S>, const State, State>;
    auto* s = dynamic_cast<Target*>(&state);
    if (s == nullptr) {
      throw_error(ErrorCode::kInternal, std::string(Traits::kName) +
                                            " holds parameter state of another type: " +
                                            c10::demangle(typeid(state).name()));
    }
    return *s;
  }
};

const Kind& kind_of(const optim::Optimizer& optimizer) {
  static const KindOf<Adam> adam{};
  static const KindOf<AdamW> adamw{};
  static const KindOf<Sgd> sgd{};
  static const KindOf<RmsProp> rmsprop{};
  static const KindOf<Adagrad> adagrad{};
  for (const Kind* kind :
       std::initializer_list<const Kind*>{&adam, &adamw, &sgd, &rmsprop, &adagrad}) {
    if (kind->is(optimizer)) return *kind;
  }
  throw_error(ErrorCode::kUnsupported,
              "unsupported optimizer: " + c10::demangle(typeid(optimizer).name()) +
                  " (supported: Adam, AdamW, SGD, RMSprop, Adagrad)");
}

// LibTorch keys an optimizer's per-parameter state by the parameter's TensorImpl address.
using StateMap = std::decay_t<decltype(std::declval<optim::Optimizer&>().state())>;
using StateKey = StateMap::key_type;

StateKey state_key(const at::Tensor& param) { return compat::optimizer_state_key<StateMap>(param); }

// The module's name of every parameter of every group.
std::vector<std::vector<std::string>> param_names(const optim::Optimizer& optimizer,
                                                  const torch::nn::Module& module) {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (item.value().defined()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  std::vector<std::vector<std::string>> groups;
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& params = optimizer.param_groups()[g].params();
    groups.emplace_back();
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = names.find(params[i].unsafeGetTensorImpl());
      if (it == names.end()) {
        throw_error(ErrorCode::kInvalidArgument, "optimizer parameter " + std::to_string(i) +
                                                     " of group " + std::to_string(g) + " (shape " +
                                                     detail::shape_string(params[i].sizes()) +
                                                     ") is not a parameter of the module");
      }
      groups.back().push_back(it->second);
    }
  }
  return groups;
}

// Why `config` does not describe this optimizer's groups, or "" when it does.
std::string config_problem(const Kind& kind, const json& config,
                           const std::vector<std::vector<std::string>>& names) {
  if (!config.is_object() || !config.contains("type") || !config.contains("param_groups") ||
      !config.contains("stateful")) {
    return "no optimizer config (type, param_groups, stateful) with the state";
  }
  if (config["type"] != kind.name()) {
    return "state of " + config["type"].dump() + ", optimizer is " + kind.name();
  }
  const json& groups = config["param_groups"];
  if (!groups.is_array() || groups.size() != names.size()) {
    return std::to_string(groups.size()) + " param group(s) in state, " +
           std::to_string(names.size()) + " in optimizer";
  }
  for (size_t g = 0; g < names.size(); ++g) {
    if (!groups[g].is_object() || groups[g].value("params", json()) != json(names[g])) {
      return "group " + std::to_string(g) + " holds other parameters in state (" +
             groups[g].value("params", json()).dump() + ") than in optimizer (" +
             json(names[g]).dump() + ")";
    }
  }
  return "";
}

}  // namespace

OptimizerState optimizer_state(const optim::Optimizer& optimizer, const torch::nn::Module& module) {
  const Kind& kind = kind_of(optimizer);
  const auto names = param_names(optimizer, module);
  OptimizerState out;
  json groups = json::array(), stateful = json::array();
  for (size_t g = 0; g < names.size(); ++g) {
    const auto& group = optimizer.param_groups()[g];
    json j = kind.options_json(group.options());
    j["params"] = names[g];
    groups.push_back(std::move(j));
    for (size_t i = 0; i < names[g].size(); ++i) {
      auto it = optimizer.state().find(state_key(group.params()[i]));
      if (it == optimizer.state().end()) continue;
      stateful.push_back(names[g][i]);
      kind.read(*it->second, [&](const char* field, const at::Tensor& t) {
        out.state.insert(names[g][i] + "/" + field, t);
      });
    }
  }
  out.config = {{"type", kind.name()}, {"param_groups", groups}, {"stateful", stateful}};
  return out;
}

ApplyReport apply_optimizer_state(optim::Optimizer& optimizer, const torch::nn::Module& module,
                                  const OptimizerState& state, const ApplyOptions& options) {
  detail::ApplyPlan plan;
  detail::plan_optimizer(optimizer, module, state.state, state.config, "", plan);
  return plan.finish(options.strict, "apply_optimizer_state");
}

namespace detail {

void plan_optimizer(optim::Optimizer& optimizer, const torch::nn::Module& module,
                    const StateDict& state, const json& config, const std::string& prefix,
                    ApplyPlan& plan) {
  const Kind& kind = kind_of(optimizer);
  const auto names = param_names(optimizer, module);
  if (auto problem = config_problem(kind, config, names); !problem.empty()) {
    plan.mismatch(prefix + "param_groups", problem);
    return;
  }

  // Hyper-parameters first: they decide which fields each parameter's state has.
  std::vector<std::shared_ptr<optim::OptimizerOptions>> group_options;
  for (size_t g = 0; g < names.size(); ++g) {
    try {
      group_options.push_back(
          kind.parse_options(config["param_groups"][g], optimizer.param_groups()[g].options()));
    } catch (const json::exception& e) {
      plan.mismatch(prefix + "param_groups",
                    "group " + std::to_string(g) + " hyper-parameters: " + e.what());
      return;
    }
  }
  std::set<std::string> stateful;
  try {
    stateful = config["stateful"].get<std::set<std::string>>();
  } catch (const json::exception& e) {
    plan.mismatch(prefix + "param_groups", std::string("stateful parameters: ") + e.what());
    return;
  }
  plan.then(prefix + "param_groups", [&optimizer, group_options] {
    for (size_t g = 0; g < group_options.size(); ++g) {
      optimizer.param_groups()[g].set_options(group_options[g]->clone());
    }
  });

  const auto known = kind.known();
  std::set<std::string> used;
  for (size_t g = 0; g < names.size(); ++g) {
    for (size_t i = 0; i < names[g].size(); ++i) {
      const std::string& name = names[g][i];
      const at::Tensor& param = optimizer.param_groups()[g].params()[i];
      const StateKey key = state_key(param);
      if (!stateful.count(name)) {
        if (optimizer.state().count(key))
          plan.then("", [&optimizer, key] { optimizer.state().erase(key); });
        continue;
      }
      // The fields to set: those the options require plus any other known one present.
      std::set<std::string> fields;
      for (const auto& f : kind.required(*group_options[g])) fields.insert(f);
      for (const auto& f : known) {
        if (state.contains(name + "/" + f)) fields.insert(f);
      }
      bool whole = true;
      for (const auto& f : fields) {
        const std::string k = name + "/" + f;
        if (!state.contains(k)) {
          plan.missing(prefix + k);
          whole = false;
          continue;
        }
        used.insert(k);
        const at::Tensor& t = state.at(k);
        const bool fits = f == "step"
                              ? t.dim() == 0 && !at::isFloatingType(t.scalar_type()) &&
                                    t.scalar_type() != at::kBool
                              : at::isFloatingType(t.scalar_type()) && t.sizes() == param.sizes();
        if (!fits) {
          plan.mismatch(prefix + k, std::string(c10::toString(t.scalar_type())) + " of shape " +
                                        shape_string(t.sizes()) + " in state, parameter is " +
                                        shape_string(param.sizes()) +
                                        (f == "step" ? " (step: a 0-d integer)" : ""));
          whole = false;
        }
      }
      if (!whole) continue;  // A parameter's state is applied whole or not at all.
      plan.then("", [&optimizer, &kind, key] {
        auto& slot = optimizer.state()[key];
        if (!slot) slot = kind.make_state();
      });
      for (const auto& f : fields) {
        const at::Tensor source = state.at(name + "/" + f);
        plan.then(prefix + name + "/" + f, [&optimizer, &kind, key, f, source, param] {
          kind.set_field(*optimizer.state().at(key), f, source, param);
        });
      }
    }
  }
  for (const auto& [k, entry] : state) {
    if (!used.count(k)) plan.unexpected(prefix + k);
  }
}

}  // namespace detail
}  // namespace tsnap
