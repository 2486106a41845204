#pragma once
// Measurement helpers of the bench library: a series of timings (median, min, max), figures of
// this process (RSS, CPU time), page-cache control, and the baselines a save or a load is
// compared with (a 2-thread memcpy, torch::save, torch::load, a buffered read). The raw device
// baseline is RawIo (raw_io.h).

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/state_dict.h"

namespace tsnap::bench {

using Clock = std::chrono::steady_clock;

/// Seconds since `t0`.
double since(Clock::time_point t0);

/// Timings of repetitions (seconds or any other figure).
struct Series {
  std::vector<double> v;
  void add(double x) { v.push_back(x); }
  bool empty() const { return v.empty(); }
  /// The median; 0 when empty.
  double median() const;
  /// The smallest value; 0 when empty.
  double min() const;
  /// The largest value; 0 when empty.
  double max() const;
};

/// A field of /proc/self/status in KiB ("VmRSS:", "VmHWM:"); 0 when absent.
long status_kib(const char* field);
/// Current resident set size of this process, KiB.
long rss_kib();
/// Peak resident set size of this process, KiB (getrusage: not reset by reset_peak_rss).
long peak_rss_kib();
/// Resets the peak-RSS mark (VmHWM) to the current RSS; false where the kernel refuses.
bool reset_peak_rss();
/// User + system CPU time of this process so far, seconds.
double process_cpu_s();

/// Drops `path`'s clean pages from the page cache (posix_fadvise DONTNEED; no root needed, and
/// other files stay cached). Throws std::runtime_error if it cannot be opened.
void evict_from_cache(const std::string& path);
/// The regular files under `dir`, recursively.
std::vector<std::string> files_under(const std::filesystem::path& dir);

/// Bytes of `sd`'s tensors once stored with floating tensors as `dtype` (unset keeps them).
uint64_t output_bytes(const StateDict& sd, std::optional<at::ScalarType> dtype);

/// A plain 2-thread memcpy of `sd`'s output bytes (as stored under `dtype`) into `dst`, which
/// holds at least output_bytes(sd, dtype): the floor of a save's stall. With `convert`, the
/// floating tensors are converted to `dtype` instead (format::convert, the kernel staging uses):
/// the floor of a converting save's stall. Returns the seconds.
double memcpy_2threads(const StateDict& sd, std::optional<at::ScalarType> dtype, uint8_t* dst,
                       bool convert = false);

/// Maps `bytes` of fresh memory advised into huge pages and first-touches it with a memset on
/// one thread, as staging pools were pre-faulted before they were populated in parallel in the
/// kernel: the baseline of a Snapshotter's construction. Returns the seconds (unmapped after).
double memset_first_touch(uint64_t bytes);

/// torch::save of `sd`'s tensors (a std::vector<at::Tensor>) to `path`, then fsync; returns the
/// seconds. The file is kept when `keep`, else removed. Throws on failure (no file is left).
double torch_save_fsync(const StateDict& sd, const std::string& path, bool keep = false);
/// torch::load of a file written by torch_save_fsync; returns the seconds.
double torch_load(const std::string& path);

/// Reads `path` through the page cache, 16 MiB at a time, and discards it (also: to make it
/// warm); returns the seconds. Throws std::runtime_error if it cannot be opened.
double buffered_read(const std::string& path);

}  // namespace tsnap::bench
