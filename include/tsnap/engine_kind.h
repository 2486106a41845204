#pragma once
/// \file
/// The choices shared by the save and load options: which io engine runs (`EngineKind`) and what
/// a save does when too many are in flight (`InFlightPolicy`).

namespace tsnap {

/// Which io engine to use.
enum class EngineKind {
  kAuto,    ///< io_uring with O_DIRECT where the kernel and filesystem allow it, else pwrite.
  kUring,   ///< io_uring only (throws where it is unavailable).
  kPwrite,  ///< A pool of threads calling pwrite/pread.
};

/// What `save_async` does while earlier saves are still writing and `max_in_flight` is reached.
enum class InFlightPolicy {
  kWait,      ///< Block until one completes (default: never lose a snapshot).
  kFailFast,  ///< Throw Error(kBusy) at once.
};

}  // namespace tsnap
