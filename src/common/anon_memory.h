#pragma once
// Private anonymous memory for bulk data (staging pools, read buffers): an
// mmap'd region, optionally advised into transparent huge pages, and the means to fault pages
// in ahead of use. Measured on this project's 2-core VM, first touches of 1.5 GB cost: 1.3-1.7 s
// by a memset on one thread (4 KiB faults, no faster on two); 0.7 s populated in-kernel
// (MADV_POPULATE_WRITE); as 2 MiB pages 0.2 s when the memory was freed just before, but 2-3 s
// on one thread and 0.7 s on two when the host had taken it back meanwhile (free page
// reporting). So huge pages suit long-lived memory populated on every core at once (the
// staging pool); and a huge-page region must be populated before the kernel copies into it
// (a pread into one that was not ran 4-10x slower).
//
// Thread-safety: immutable once made. Ownership: owns the mapping; unmapped by the destructor.

#include <cstdint>
#include <string>

namespace tsnap::detail {

class AnonMemory {
 public:
  /// Maps `bytes` (rounded up to 4096, at least one page), zero-fill on demand; `huge` advises
  /// transparent huge pages (ignored where unsupported). `what` names the use in the error.
  /// Errors: IoError naming `what`, the size and errno when the mapping fails.
  AnonMemory(uint64_t bytes, bool huge, const std::string& what);
  ~AnonMemory();
  AnonMemory(const AnonMemory&) = delete;
  AnonMemory& operator=(const AnonMemory&) = delete;

  uint8_t* data() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

/// Faults in the pages of [p, p + len) now, keeping their contents: in-kernel
/// (MADV_POPULATE_WRITE, Linux 5.14+), else by rewriting one byte of each page. For memory
/// that nothing else uses meanwhile (e.g. right before a read into it is submitted).
void populate(uint8_t* p, uint64_t len);
/// Faults in the pages of [p, p + len) in-kernel only (MADV_POPULATE_WRITE), never touching
/// their bytes, so that other threads may write them meanwhile. Returns false, having done
/// nothing, where the kernel cannot (before Linux 5.14).
bool populate_untouched(uint8_t* p, uint64_t len);
/// populate() split over one thread per core (the calling thread included): fresh pages are
/// faulted in by each core independently, which on a VM also spreads the host's faults.
void populate_in_parallel(uint8_t* p, uint64_t len);

}  // namespace tsnap::detail
