#pragma once
// The device's limit, the baseline of every save and restore figure: sequential writes and
// reads of a plain file through an io engine of the kind tsnap uses, from warm aligned buffers,
// with no staging. RawIo owns the benchmarks' only io engine and io thread outside tsnap.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tsnap::bench {

/// How a RawIo is set up.
struct RawIoOptions {
  bool uring = true;    ///< io_uring (throws if unavailable), else a pwrite pool of 4 threads
  unsigned depth = 32;  ///< io_uring queue depth; transfers in flight are min(depth, buffers)
  uint64_t chunk = 16ull << 20;   ///< bytes per transfer (a multiple of 4096)
  size_t buffers = 2;             ///< aligned buffers of `chunk` bytes, allocated and touched
  bool register_buffers = false;  ///< register them with the engine (io_uring fixed buffers)
};

/// Sequential transfers of whole files, `chunk` bytes at a time, through its own engine.
/// Thread-safety: one transfer at a time (not thread-safe). Ownership: owns its engine, its io
/// thread and its buffers; the destructor stops the thread.
class RawIo {
 public:
  /// Builds the engine and its io thread and allocates the buffers.
  /// Errors: std::runtime_error when io_uring is asked for and refused; std::bad_alloc.
  explicit RawIo(const RawIoOptions& options);
  ~RawIo();
  RawIo(const RawIo&) = delete;
  RawIo& operator=(const RawIo&) = delete;

  /// Writes `bytes` (rounded up to 4096) to `path` (O_DIRECT if `direct`), then fsyncs; returns
  /// the seconds. The file is kept when `keep`, else removed. Throws std::runtime_error naming
  /// the file and errno on failure (and removes the file).
  double write(const std::string& path, uint64_t bytes, bool direct, bool keep = false);
  /// Reads `path` sequentially to its end (O_DIRECT if `direct`); returns the seconds.
  /// Throws std::runtime_error naming the file and errno on failure.
  double read(const std::string& path, bool direct);
  /// The engine's name ("io_uring", "pwrite").
  std::string engine_name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tsnap::bench
