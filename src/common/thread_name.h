#pragma once
// Names for the threads tsnap starts, so that `top -H`, `ps -L`, gdb and perf tell them from
// the training's threads, and a user can see (and a benchmark can measure) what snapshots cost
// in CPU time: tsnap-io (writes and reads: the io_uring thread, the pwrite pool), tsnap-pipeline
// (hashing, lazy staging, commits), tsnap-stage (staging copies; TBB workers of the staging
// arenas), tsnap-fault (faulting the staging pool in), tsnap-drain, tsnap-read (restore helpers),
// tsnap-hook and tsnap-callback (periodic snapshots). Every name starts with kThreadNamePrefix.

namespace tsnap::detail {

inline constexpr const char* kThreadNamePrefix = "tsnap-";

/// Names the calling thread (at most 15 characters are kept). Linux only; elsewhere, or where
/// the kernel refuses, the thread keeps its name.
void name_this_thread(const char* name);

}  // namespace tsnap::detail
