#pragma once
// The log lines of a PeriodicSnapshots hook: one per snapshot, one summary.

#include <string>

#include "tsnap/periodic_snapshots.h"

namespace tsnap::policy {

/// "tsnap: step-00000200 committed (steps): 20.1 MB, blocked 6.2 ms (stall 5.9 ms, stage 5.8 ms),
/// write 41.0 ms, commit 3.2 ms, total 52.3 ms, 0.38 GB/s, io_uring+O_DIRECT; deleted
/// step-00000100", or "... FAILED (steps): <error>".
std::string snapshot_line(const SnapshotRecord& record);

/// "tsnap: 5 snapshots (5 committed, 0 failed), 1 skipped, 3 deleted; training blocked 31.0 ms
/// in total (6.2 ms per snapshot), 100.5 MB written".
std::string summary_line(const PeriodicStats& stats);

}  // namespace tsnap::policy
