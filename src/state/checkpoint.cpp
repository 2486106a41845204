#include "tsnap/checkpoint.h"

#include <torch/version.h>

#include <chrono>
#include <set>

#include "format/layout.h"
#include "state/apply.h"
#include "tsnap/error.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

using nlohmann::json;

void check_names(const Checkpoint::Objects& objects) {
  std::set<std::string> seen;
  for (const auto& [name, object] : objects) {
    if (name.empty() || name.find('/') != std::string::npos || !seen.insert(name).second) {
      throw_error(ErrorCode::kInvalidArgument,
                  "bad checkpoint object name '" + name +
                      "' (names are non-empty, unique and have no '/')");
    }
  }
}

void check_user_metadata(const json& metadata) {
  if (!metadata.is_object()) {
    throw_error(
        ErrorCode::kInvalidArgument,
        std::string("checkpoint metadata must be a JSON object, not ") + metadata.type_name());
  }
  if (metadata.contains(kCheckpointInfoKey)) {
    throw_error(ErrorCode::kInvalidArgument, std::string("checkpoint metadata key '") +
                                                 kCheckpointInfoKey + "' is reserved for tsnap");
  }
}

// tsnap's record of a checkpoint made now.
json make_info() {
  const auto now = std::chrono::system_clock::now();
  const int64_t unix_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  return {{"tsnap_version", TSNAP_VERSION_STRING},
          {"torch_version", TORCH_VERSION},
          {"format_version", kFormatVersion},
          {"created", format::utc_timestamp(now)},
          {"created_unix_ns", unix_ns},
          {"objects", json::object()}};
}

const OptimizerBinding& checked(const OptimizerBinding& binding, const std::string& name) {
  if (binding.optimizer == nullptr || binding.module == nullptr) {
    throw_error(ErrorCode::kInvalidArgument, "checkpoint object '" + name +
                                                 "': optimizer binding without optimizer "
                                                 "or module");
  }
  return binding;
}

}  // namespace

Checkpoint::Checkpoint() : info_(make_info()) {}

Checkpoint Checkpoint::of(const Objects& objects, json metadata) {
  check_names(objects);
  check_user_metadata(metadata);
  Checkpoint checkpoint;
  checkpoint.metadata_ = std::move(metadata);
  for (const auto& [name, object] : objects) {
    StateDict state;
    json record;
    switch (object.kind_) {
      case Object::Kind::kModule:
        state = model_state(*object.module_);
        record = {{"kind", "module"}};
        break;
      case Object::Kind::kJitModule:
        state = model_state(*object.jit_);
        record = {{"kind", "jit_module"}};
        break;
      case Object::Kind::kOptimizer: {
        const auto& binding = checked(object.optimizer_, name);
        OptimizerState optimizer = optimizer_state(*binding.optimizer, *binding.module);
        state = std::move(optimizer.state);
        record = std::move(optimizer.config);
        record["kind"] = "optimizer";
        break;
      }
      case Object::Kind::kRng:
        state = object.tensors_;
        record = {{"kind", "rng"}};
        break;
      case Object::Kind::kTensors:
        state = object.tensors_;
        record = {{"kind", "tensors"}};
        break;
      case Object::Kind::kStateful: {
        StatefulState stateful = object.stateful_->state_dict();
        if (!stateful.values.is_object()) {
          throw_error(ErrorCode::kInvalidArgument,
                      "checkpoint object '" + name +
                          "': Stateful::state_dict() values must be a JSON object, not " +
                          stateful.values.type_name());
        }
        state = std::move(stateful.tensors);
        record = {{"kind", "stateful"}, {"values", std::move(stateful.values)}};
        break;
      }
    }
    for (auto& [key, entry] : state) {
      checkpoint.state_.insert(name + "/" + key, entry.tensor, entry.dtype, entry.shard);
    }
    checkpoint.info_["objects"][name] = std::move(record);
  }
  return checkpoint;
}

Checkpoint Checkpoint::from_saved(StateDict state, const json& saved) {
  if (!saved.is_object()) {
    throw_error(
        ErrorCode::kInvalidArgument,
        std::string("saved checkpoint metadata must be a JSON object, not ") + saved.type_name());
  }
  Checkpoint checkpoint;
  checkpoint.state_ = std::move(state);
  checkpoint.metadata_ = saved;
  auto info = checkpoint.metadata_.find(kCheckpointInfoKey);
  if (info != checkpoint.metadata_.end()) {
    checkpoint.info_ = std::move(*info);
    checkpoint.metadata_.erase(info);
  } else {
    checkpoint.info_ = json::object();  // Not saved as a checkpoint: nothing is known.
  }
  return checkpoint;
}

json Checkpoint::saved_metadata() const {
  check_user_metadata(metadata_);
  json saved = metadata_;
  saved[kCheckpointInfoKey] = info_;
  return saved;
}

StateDict Checkpoint::object_state(const std::string& name) const {
  const std::string prefix = name + "/";
  StateDict out;
  for (const auto& [key, entry] : state_) {
    if (key.compare(0, prefix.size(), prefix) == 0) {
      out.insert(key.substr(prefix.size()), entry.tensor, entry.dtype, entry.shard);
    }
  }
  return out;
}

StatefulState Checkpoint::object(const std::string& name) const {
  StatefulState out;
  out.tensors = object_state(name);
  auto objects_info = info_.find("objects");
  if (objects_info != info_.end() && objects_info->is_object()) {
    auto record = objects_info->find(name);
    if (record != objects_info->end() && record->is_object()) {
      auto values = record->find("values");
      if (values != record->end() && values->is_object()) out.values = *values;
    }
  }
  return out;
}

bool Checkpoint::holds(const std::string& name) const {
  auto objects_info = info_.find("objects");
  if (objects_info != info_.end() && objects_info->is_object() && objects_info->contains(name)) {
    return true;
  }
  const std::string prefix = name + "/";
  for (const auto& [key, entry] : state_) {
    if (key.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

ApplyReport Checkpoint::apply(const Objects& objects, const ApplyOptions& options) const {
  check_names(objects);
  detail::ApplyPlan plan;
  // Stateful objects load first (queued before any tensor copy), so that an exception from one
  // leaves every model, optimizer and tensor as it was.
  for (const auto& [name, object] : objects) {
    if (object.kind_ != Object::Kind::kStateful) continue;
    if (!holds(name)) {
      plan.missing(name + "/");
      continue;
    }
    plan.then(name + "/", [stateful = object.stateful_, state = this->object(name)] {
      stateful->load_state_dict(state);
    });
  }
  for (const auto& [name, object] : objects) {
    const StateDict state = object_state(name);
    const std::string prefix = name + "/";
    switch (object.kind_) {
      case Object::Kind::kModule:
        detail::plan_module(*object.module_, state, prefix, plan);
        break;
      case Object::Kind::kJitModule:
        detail::plan_module(*object.jit_, state, prefix, plan);
        break;
      case Object::Kind::kOptimizer: {
        const auto& binding = checked(object.optimizer_, name);
        json config;
        auto objects_info = info_.find("objects");
        if (objects_info != info_.end() && objects_info->contains(name)) {
          config = (*objects_info)[name];
        }
        detail::plan_optimizer(*binding.optimizer, *binding.module, state, config, prefix, plan);
        break;
      }
      case Object::Kind::kRng:
        detail::plan_rng(state, prefix, plan);
        break;
      case Object::Kind::kTensors: {
        std::vector<std::pair<std::string, at::Tensor>> destinations;
        for (const auto& [key, entry] : object.tensors_)
          destinations.emplace_back(key, entry.tensor);
        detail::plan_tensors(destinations, state, prefix, plan);
        break;
      }
      case Object::Kind::kStateful:
        break;  // Queued above.
    }
  }
  return plan.finish(options.strict, "Checkpoint::apply");
}

SaveStats save(const std::filesystem::path& path, const Checkpoint& checkpoint,
               const SaveOptions& options) {
  return save(path, checkpoint.state(), checkpoint.saved_metadata(), options);
}

namespace {

void check_no_prefix(const LoadOptions& options) {
  if (!options.key_prefix.empty()) {
    throw_error(ErrorCode::kInvalidArgument,
                "load_checkpoint keeps the objects' prefixes: select an object's keys with "
                "include = {\"" +
                    options.key_prefix + "*\"} instead of key_prefix");
  }
}

}  // namespace

Checkpoint load_checkpoint(const std::filesystem::path& path, const LoadOptions& options) {
  check_no_prefix(options);
  const Manifest manifest = read_manifest(path);
  return Checkpoint::from_saved(load(path, options), manifest.metadata);
}

Checkpoint load_checkpoint(const HotSnapshot& snapshot, const LoadOptions& options) {
  check_no_prefix(options);
  StateDict state = load(snapshot, options);  // checks the handle before manifest() would
  return Checkpoint::from_saved(std::move(state), snapshot.manifest().metadata);
}

SaveHandle Snapshotter::save_async(const std::string& name, const Checkpoint& checkpoint,
                                   const SaveOptions& options) {
  return save_async(name, checkpoint.state(), checkpoint.saved_metadata(), options);
}

void Snapshotter::prepare(const Checkpoint& checkpoint, const SaveOptions& options) {
  prepare(checkpoint.state(), options);
}

}  // namespace tsnap
