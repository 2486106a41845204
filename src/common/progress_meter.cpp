#include "common/progress_meter.h"

namespace tsnap::detail {

void ProgressMeter::add(uint64_t staged, uint64_t done) {
  if (!fn_) return;
  std::lock_guard<std::mutex> lock(mu_);
  progress_.staged_bytes += staged;
  progress_.done_bytes += done;
  try {
    fn_(progress_);
  } catch (...) {
    // A progress display must never fail a save or a load.
  }
}

}  // namespace tsnap::detail
