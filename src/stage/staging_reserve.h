#pragma once
// Memory faulted in ahead of the next staging pool (tsnap::reserve_staging_memory). A staging
// pool's pages must be faulted in before a save copies into them, and the pool of a Snapshotter
// with the automatic budget is made by its first save, which then stalls for it (3-6x a copy
// into warm memory: common/anon_memory.h). Code that learns the state's size before it knows
// where the state will be saved (a trainer's plugin, at the first optimizer step) reserves that
// much here; the faulting runs on a background thread while training goes on, and the next
// pool made in this process takes the memory (resized to what it needs: the faulted pages are
// kept) instead of mapping fresh pages.
//
// Thread-safety: all functions are thread-safe. One reservation per process: a new one
// replaces the previous (unmapped).

#include <cstdint>
#include <memory>
#include <string>

#include "common/anon_memory.h"

namespace tsnap::stage {

/// Maps `bytes` (0: releases the reservation) and faults them in on a background thread (at a
/// lower CPU priority), or on the caller when `wait`. Errors: IoError when the mapping fails.
void reserve(uint64_t bytes, bool wait);

/// Bytes reserved and not taken yet.
uint64_t reserved_bytes();

/// What take() hands over.
struct Reserved {
  std::unique_ptr<detail::AnonMemory> memory;  // null: nothing was reserved
  uint64_t faulted = 0;                        // bytes at the front of `memory` faulted in already
};

/// Takes the reservation for a pool of `bytes`: stops its faulting (what it has done is kept)
/// and resizes it to `bytes`. `what` names the use in an error. Errors: IoError when the
/// resize fails (the reservation is then released).
Reserved take(uint64_t bytes, const std::string& what);

}  // namespace tsnap::stage
