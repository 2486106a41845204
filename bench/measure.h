#pragma once
// Measurement helpers shared by the benchmark programs under bench/ and by `tsnap bench`:
// a series of timings (median, min, max), RSS figures, and the baselines a save is compared
// with (raw sequential write through the same io engine, a 2-thread memcpy, torch::save).

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/state_dict.h"

namespace tsnap::io {
class Engine;
}

namespace tsnap::bench {

using Clock = std::chrono::steady_clock;

/// Seconds since `t0`.
double since(Clock::time_point t0);

/// Timings of repetitions (seconds or any other figure).
struct Series {
  std::vector<double> v;
  void add(double x) { v.push_back(x); }
  bool empty() const { return v.empty(); }
  double median() const;
  double min() const;
  double max() const;
};

/// Current resident set size of this process, KiB.
long rss_kib();
/// Peak resident set size of this process, KiB.
long peak_rss_kib();
/// User + system CPU time of this process so far, seconds.
double process_cpu_s();

/// Bytes of `sd`'s tensors once stored with floating tensors as `dtype` (unset keeps them).
uint64_t output_bytes(const StateDict& sd, std::optional<at::ScalarType> dtype);

/// The device's limit: sequential writes (and reads) of a plain file through an io engine of
/// the kind tsnap uses, `chunk` bytes at a time and `depth` in flight, from warm aligned
/// buffers, no staging. Owns its engine, its io thread and its buffers.
class RawIo {
 public:
  /// `uring` picks the io_uring engine (throws if unavailable), else a pwrite pool of 4.
  /// `buffers` aligned buffers of `chunk` bytes are allocated and touched.
  RawIo(bool uring, unsigned depth, uint64_t chunk, size_t buffers);
  ~RawIo();
  RawIo(const RawIo&) = delete;
  RawIo& operator=(const RawIo&) = delete;

  /// Writes `bytes` to `path` (O_DIRECT if `direct`), then fsyncs; returns the seconds.
  /// The file is kept when `keep`, else removed. Throws std::runtime_error on failure.
  double write(const std::string& path, uint64_t bytes, bool direct, bool keep = false);
  /// Reads `path` sequentially to its end (O_DIRECT if `direct`); returns the seconds.
  double read(const std::string& path, bool direct);
  std::string engine_name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A plain 2-thread memcpy of `sd`'s output bytes (as stored under `dtype`) into `dst`, which
/// holds at least output_bytes(sd, dtype): the floor of a save's stall. Returns the seconds.
double memcpy_2threads(const StateDict& sd, std::optional<at::ScalarType> dtype, uint8_t* dst);

/// torch::save of `sd`'s tensors (a std::vector<at::Tensor>) to `path`, then fsync; returns the
/// seconds. The file is kept when `keep`, else removed.
double torch_save_fsync(const StateDict& sd, const std::string& path, bool keep = false);
/// torch::load of a file written by torch_save_fsync; returns the seconds.
double torch_load(const std::string& path);

}  // namespace tsnap::bench
