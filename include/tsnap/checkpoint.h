#pragma once
/// \file
/// `tsnap::Checkpoint`: several objects (models, optimizers, LR schedulers, random generators,
/// tensors, your own Stateful objects) and metadata, as one flat StateDict with keys
/// `<object>/<key>`. Creating, saving, loading and applying a checkpoint are separate steps, so its
/// contents can be inspected and edited between them:
/// ```
/// auto ckpt = tsnap::Checkpoint::of({{"model", model}, {"optim", tsnap::bind(opt, model)},
///                                    {"sched", scheduler}, {"rng", tsnap::rng_state()}},
///                                   {{"epoch", 3}});
/// tsnap::save(path, ckpt);
/// auto loaded = tsnap::load_checkpoint(path);
/// loaded.apply({{"model", model}, {"optim", tsnap::bind(opt, model)}, {"sched", scheduler},
///               {"rng", tsnap::rng_state()}});
/// int epoch = loaded.metadata()["epoch"];
/// ```

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tsnap/apply_report.h"
#include "tsnap/export.h"
#include "tsnap/hot_snapshot.h"
#include "tsnap/load.h"
#include "tsnap/model_state.h"
#include "tsnap/optimizer_state.h"
#include "tsnap/rng_state.h"
#include "tsnap/save.h"
#include "tsnap/state_dict.h"
#include "tsnap/stateful.h"

namespace tsnap {

/// The metadata key under which a saved checkpoint keeps tsnap's own record (versions, creation
/// time, objects, optimizer hyper-parameters), apart from the user's metadata.
inline constexpr const char* kCheckpointInfoKey = "tsnap";

/// A checkpoint: a flat state (`<object>/<key>` -> tensor), the user's metadata (a JSON object)
/// and tsnap's record of how it was made (`info()`).
/// Thread-safety: like a std::map (concurrent const use is fine). Ownership: a value type whose
/// tensors refer to the objects' own (no copies): the state follows training until it is saved.
class TSNAP_API Checkpoint {
 public:
  /// One object of a checkpoint, by reference: it must outlive the `of` or `apply` call.
  class Object {
   public:
    /// A model: its parameters and buffers (`model_state`).
    Object(const torch::nn::Module& module) : kind_(Kind::kModule), module_(&module) {}
    /// A model handle: `std::shared_ptr<Net>` or a `TORCH_MODULE` holder.
    template <class Handle, std::enable_if_t<detail::IsModuleHandle<Handle>::value, int> = 0>
    Object(const Handle& handle) : Object(static_cast<const torch::nn::Module&>(*handle)) {}
    /// A TorchScript model.
    Object(const torch::jit::Module& module) : kind_(Kind::kJitModule), jit_(&module) {}
    /// An optimizer bound to its model (`tsnap::bind(opt, model)`).
    Object(OptimizerBinding optimizer) : kind_(Kind::kOptimizer), optimizer_(optimizer) {}
    /// The random generators (see RngState: captured by `of`, restored by `apply`).
    Object(RngState rng) : kind_(Kind::kRng), tensors_(std::move(rng.generators)) {}
    /// Any tensors: saved as they are, copied into in place by `apply`.
    Object(StateDict tensors) : kind_(Kind::kTensors), tensors_(std::move(tensors)) {}
    /// A Stateful object, by reference.
    Object(Stateful& object)
        : kind_(Kind::kStateful), stateful_(std::shared_ptr<Stateful>(), &object) {}
    /// A Stateful object, shared (e.g. `std::make_shared<DataPosition>()`).
    template <class T, std::enable_if_t<std::is_base_of_v<Stateful, T>, int> = 0>
    Object(std::shared_ptr<T> object) : kind_(Kind::kStateful), stateful_(std::move(object)) {}
    /// A LibTorch LR scheduler (`StepLR`, ...), as SchedulerState: save and apply it with its
    /// optimizer, which holds the learning rates.
    Object(torch::optim::LRScheduler& scheduler)
        : kind_(Kind::kStateful), stateful_(std::make_shared<SchedulerState>(scheduler)) {}

   private:
    friend class Checkpoint;
    enum class Kind { kModule, kJitModule, kOptimizer, kRng, kTensors, kStateful };
    Kind kind_;
    const torch::nn::Module* module_ = nullptr;
    const torch::jit::Module* jit_ = nullptr;
    OptimizerBinding optimizer_;
    StateDict tensors_;
    std::shared_ptr<Stateful> stateful_;
  };
  /// Objects by name; a name is non-empty, unique and has no '/'.
  using Objects = std::vector<std::pair<std::string, Object>>;

  /// An empty checkpoint whose info records the versions and the time now.
  Checkpoint();

  /// The state of `objects` now (models and optimizers by reference, generators by value) with
  /// the user's `metadata` (a JSON object). tsnap's info records the tsnap, LibTorch and format
  /// versions, the creation time, each object's kind, each optimizer's hyper-parameters and each
  /// Stateful object's values. Errors: InvalidArgument for a bad or repeated name, non-object
  /// metadata or a Stateful whose values are not a JSON object; those of model_state,
  /// optimizer_state (Error(kUnsupported) for an unsupported optimizer) and of the Stateful
  /// objects' `state_dict()`.
  static Checkpoint of(const Objects& objects, nlohmann::json metadata = nlohmann::json::object());

  /// A checkpoint from a loaded state and the metadata it was saved with (`saved_metadata()`):
  /// tsnap's info is split from the user's metadata. Errors: InvalidArgument if `saved` is not
  /// a JSON object.
  static Checkpoint from_saved(StateDict state, const nlohmann::json& saved);

  /// The flat state, editable (e.g. erase a key before saving).
  StateDict& state() { return state_; }
  const StateDict& state() const { return state_; }
  /// The user's metadata (a JSON object), editable; never holds tsnap's info.
  nlohmann::json& metadata() { return metadata_; }
  const nlohmann::json& metadata() const { return metadata_; }
  /// tsnap's record: `{"tsnap_version", "torch_version", "format_version", "created",
  /// "created_unix_ns", "objects": {name: {"kind": ..., optimizer config, "values": ...}}}`
  /// ("values": a Stateful object's, editable through `object(name)`).
  const nlohmann::json& info() const { return info_; }

  /// The metadata a save writes: the user's metadata plus `info()` under kCheckpointInfoKey.
  /// Errors: InvalidArgument if the user's metadata is not an object or uses that key.
  nlohmann::json saved_metadata() const;
  /// The entries of object `name` with the `<name>/` prefix removed (empty if none).
  StateDict object_state(const std::string& name) const;
  /// Object `name` as a Stateful object would get it in `apply`: its entries (prefix removed)
  /// and its values (an empty object if it has none).
  StatefulState object(const std::string& name) const;

  /// Copies the state of each of `objects` (found under its name) into it: models in place
  /// (`apply_model_state`), optimizers with their hyper-parameters (`apply_optimizer_state`),
  /// random generators restored (`set_rng_state`), tensors copied into in place, Stateful objects
  /// (and schedulers) through `load_state_dict`. Keys of objects not named here are left alone
  /// (they are neither applied nor unexpected). Strict: every object is checked before anything
  /// changes, and one error lists all problems; a Stateful object the checkpoint does not hold
  /// (saved without it) is reported missing as `<name>/`. Stateful objects are loaded first, in
  /// the order given, before any tensor changes: if one throws, no model, optimizer or tensor
  /// has changed. Errors: InvalidArgument for bad names; InvalidArgument (kKeyNotFound,
  /// kShapeMismatch) under strict; what a Stateful's `load_state_dict` throws. Not thread-safe
  /// with respect to other users of the objects.
  ApplyReport apply(const Objects& objects, const ApplyOptions& options = {}) const;

 private:
  /// Whether the checkpoint was saved with object `name`: it has entries or a record of it.
  bool holds(const std::string& name) const;

  StateDict state_;
  nlohmann::json metadata_ = nlohmann::json::object();
  nlohmann::json info_ = nlohmann::json::object();
};

/// Saves `checkpoint` (its state and `saved_metadata()`) to the snapshot directory `path`.
/// Errors: those of `saved_metadata()` and of `tsnap::save`.
TSNAP_API SaveStats save(const std::filesystem::path& path, const Checkpoint& checkpoint,
                         const SaveOptions& options = {});

/// Loads the snapshot at `path` (the keys `options` selects) as a Checkpoint with its metadata.
/// Errors: those of `tsnap::load` and `tsnap::read_manifest`. Thread-safe.
TSNAP_API Checkpoint load_checkpoint(const std::filesystem::path& path,
                                     const LoadOptions& options = {});

/// Loads a hot snapshot (tsnap/hot_snapshot.h: `Snapshotter::hot_snapshot()`, from memory) as a
/// Checkpoint with its metadata: `load_checkpoint(snap.hot_snapshot()).apply(objects)` rolls
/// the objects back to the last snapshot without reading the disk.
/// Errors: those of `tsnap::load(const HotSnapshot&)`. Thread-safe.
TSNAP_API Checkpoint load_checkpoint(const HotSnapshot& snapshot, const LoadOptions& options = {});

}  // namespace tsnap
