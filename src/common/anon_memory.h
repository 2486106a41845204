#pragma once
// Private anonymous memory for bulk data (staging pools, read buffers): an
// mmap'd region, optionally advised into transparent huge pages, and the means to fault pages
// in ahead of use. Measured on this project's 2-core VM (kernel 6.18, THP enabled=madvise,
// defrag=madvise), first touches of 1.5 GiB cost:
// - 4 KiB pages: 0.58-0.70 s populated in-kernel (MADV_POPULATE_WRITE), on one thread or two
//   alike; 1.0 s by a memcpy into them on two threads; 1.0-1.3 s by a memset on one.
// - 2 MiB pages, by any method: 0.06-0.14 s when the memory was freed just before, 0.8-3.5 s
//   otherwise (the host takes freed memory back: free page reporting), so their cost is the
//   host's, not ours.
// Once faulted in, copies into either run alike (0.08-0.13 s for 1.5 GiB on two threads), but
// O_DIRECT writes from huge pages are faster (a 1.5 GB save 0.72-0.74 s against 0.89-0.94 s).
// So memory that someone waits for is faulted in as 4 KiB pages, in-kernel, and a long-lived
// pool is collapsed into huge pages afterwards, in the background (collapse_into_huge_pages);
// a huge-page region must be populated before the kernel copies into it (a pread into one that
// was not ran 4-10x slower).
//
// Shared memory (AnonMemory::shared) is the same, backed by a memfd that another process may map:
// a snapshot agent (pipeline/agent.h) maps a trainer's staging pool so that what the trainer
// staged outlives it.
//
// Thread-safety: immutable once made. Ownership: owns the mapping (and the memfd of shared
// memory); unmapped and closed by the destructor.

#include <cstdint>
#include <memory>
#include <string>

namespace tsnap::detail {

class AnonMemory {
 public:
  /// Maps `bytes` (rounded up to 4096, at least one page), zero-fill on demand; `huge` advises
  /// transparent huge pages (ignored where unsupported). `what` names the use in the error.
  /// Errors: IoError naming `what`, the size and errno when the mapping fails.
  AnonMemory(uint64_t bytes, bool huge, const std::string& what);
  /// Shared memory of `bytes` (rounded up as above): a new memfd when `fd` < 0, else the
  /// memfd `fd` (duplicated; the caller keeps its own), which must hold at least that many
  /// bytes. Errors: IoError naming `what`, the size and errno; kInvalidArgument when `fd` is
  /// shorter.
  static std::unique_ptr<AnonMemory> shared(uint64_t bytes, int fd, bool huge,
                                            const std::string& what);
  ~AnonMemory();
  AnonMemory(const AnonMemory&) = delete;
  AnonMemory& operator=(const AnonMemory&) = delete;

  uint8_t* data() const { return base_; }
  uint64_t size() const { return size_; }
  /// Private memory only: grows or shrinks the mapping to `bytes` (rounded up as above),
  /// keeping the pages already faulted in; data() may move. Errors: IoError naming `what`, the
  /// size and errno (the mapping is then as it was); kInvalidArgument for shared memory.
  void resize(uint64_t bytes, const std::string& what);
  /// The memfd of shared memory; -1 for private memory.
  int fd() const { return fd_; }

 private:
  AnonMemory() = default;
  void map(int flags, int fd, bool huge, const std::string& what);

  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
};

/// Faults in the pages of [p, p + len) now, keeping their contents: in-kernel
/// (MADV_POPULATE_WRITE, Linux 5.14+), else by rewriting one byte of each page. For memory
/// that nothing else uses meanwhile (e.g. right before a read into it is submitted).
void populate(uint8_t* p, uint64_t len);
/// Faults in the pages of [p, p + len) in-kernel only (MADV_POPULATE_WRITE), never touching
/// their bytes, so that other threads may write them meanwhile. Returns false, having done
/// nothing, where the kernel cannot (before Linux 5.14).
bool populate_untouched(uint8_t* p, uint64_t len);
/// Asks the kernel to replace the 4 KiB pages of the 2 MiB-aligned part of [p, p + len) by
/// huge pages, keeping their contents (MADV_COLLAPSE, Linux 6.1+). Synchronous and costly
/// (it allocates and copies): for a background thread. Safe while other threads read or
/// write the memory; pages pinned by I/O in flight stay as they are. Returns false where the
/// kernel did not collapse all of it (older kernels, no huge page to be had, pinned pages).
bool collapse_into_huge_pages(uint8_t* p, uint64_t len);
/// populate() split over one thread per core (the calling thread included): fresh pages are
/// faulted in by each core independently, which on a VM also spreads the host's faults.
void populate_in_parallel(uint8_t* p, uint64_t len);

}  // namespace tsnap::detail
