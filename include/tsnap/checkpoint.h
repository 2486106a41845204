#pragma once
/// \file
/// `tsnap::Checkpoint`: several objects (models, optimizers, random generators, tensors) and
/// metadata, as one flat StateDict with keys `<object>/<key>`. Creating, saving, loading and
/// applying a checkpoint are separate steps, so its contents can be inspected and edited between
/// them:
/// ```
/// auto ckpt = tsnap::Checkpoint::of({{"model", model}, {"optim", tsnap::bind(opt, model)},
///                                    {"rng", tsnap::rng_state()}}, {{"epoch", 3}});
/// tsnap::save(path, ckpt);
/// auto loaded = tsnap::load_checkpoint(path);
/// loaded.apply({{"model", model}, {"optim", tsnap::bind(opt, model)}, {"rng",
/// tsnap::rng_state()}}); int epoch = loaded.metadata()["epoch"];
/// ```

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tsnap/apply_report.h"
#include "tsnap/export.h"
#include "tsnap/load.h"
#include "tsnap/model_state.h"
#include "tsnap/optimizer_state.h"
#include "tsnap/rng_state.h"
#include "tsnap/save.h"
#include "tsnap/state_dict.h"

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

   private:
    friend class Checkpoint;
    enum class Kind { kModule, kJitModule, kOptimizer, kRng, kTensors };
    Kind kind_;
    const torch::nn::Module* module_ = nullptr;
    const torch::jit::Module* jit_ = nullptr;
    OptimizerBinding optimizer_;
    StateDict tensors_;
  };
  /// Objects by name; a name is non-empty, unique and has no '/'.
  using Objects = std::vector<std::pair<std::string, Object>>;

  /// An empty checkpoint whose info records the versions and the time now.
  Checkpoint();

  /// The state of `objects` now (models and optimizers by reference, generators by value) with
  /// the user's `metadata` (a JSON object). tsnap's info records the tsnap, LibTorch and format
  /// versions, the creation time, each object's kind and each optimizer's hyper-parameters.
  /// Errors: InvalidArgument for a bad or repeated name or non-object metadata; those of
  /// model_state and optimizer_state (Error(kUnsupported) for an unsupported optimizer).
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
  /// "created_unix_ns", "objects": {name: {"kind": ..., optimizer config}}}`.
  const nlohmann::json& info() const { return info_; }

  /// The metadata a save writes: the user's metadata plus `info()` under kCheckpointInfoKey.
  /// Errors: InvalidArgument if the user's metadata is not an object or uses that key.
  nlohmann::json saved_metadata() const;
  /// The entries of object `name` with the `<name>/` prefix removed (empty if none).
  StateDict object_state(const std::string& name) const;

  /// Copies the state of each of `objects` (found under its name) into it: models in place
  /// (`apply_model_state`), optimizers with their hyper-parameters (`apply_optimizer_state`),
  /// random generators restored (`set_rng_state`), tensors copied into in place. Keys of objects
  /// not named here are left alone (they are neither applied nor unexpected). Strict: every
  /// object is checked before anything changes, and one error lists all problems.
  /// Errors: InvalidArgument for bad names; InvalidArgument (kKeyNotFound, kShapeMismatch)
  /// under strict. Not thread-safe with respect to other users of the objects.
  ApplyReport apply(const Objects& objects, const ApplyOptions& options = {}) const;

 private:
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

}  // namespace tsnap
