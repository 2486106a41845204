#pragma once
/// \file
/// `tsnap::rng_state` and `tsnap::set_rng_state`: the process's default random generators, so a
/// resumed run draws the same random numbers.

#include "tsnap/export.h"
#include "tsnap/state_dict.h"

namespace tsnap {

/// The states of the default generators: "cpu" and, when LibTorch has CUDA, "cuda:<i>" for every
/// device, each the generator's own serialised state as a 1-d uint8 tensor. Value type (copies).
/// In `Checkpoint::of` it is saved as `<name>/cpu`, ...; in `Checkpoint::apply` an RngState
/// object stands for the process's generators, which get the checkpoint's states.
struct TSNAP_API RngState {
  StateDict generators;
};

/// Captures the states of the default generators now. Thread-safe (takes each generator's lock).
TSNAP_API RngState rng_state();

/// Restores the generators from `state`; every current generator must have an entry, and every
/// entry a generator. Errors: InvalidArgument (kKeyNotFound, kShapeMismatch) listing the problems,
/// with nothing changed; what LibTorch throws for a corrupt state. Thread-safe.
TSNAP_API void set_rng_state(const RngState& state);

}  // namespace tsnap
