#pragma once
// A test decorator that fails chosen engine calls: the Nth write, fsync, rename, open, ...,
// or every write once a byte budget is exhausted (a full disk). Counts are 1-based; 0 = never.
// Thread-safety: thread-safe (atomic counters).

#include <atomic>
#include <cerrno>
#include <memory>

#include "io/engine.h"

namespace tsnap::io {

struct Faults {
  int fail_write = 0;  ///< Fail the Nth write with `error`.
  int fail_read = 0;
  int fail_fsync = 0;
  int fail_rename = 0;
  int fail_open = 0;
  int fail_ftruncate = 0;
  int fail_mkdir = 0;
  int fail_fsync_dir = 0;
  uint64_t space_bytes = 0;  ///< >0: writes past this many bytes in total fail with -ENOSPC.
  int error = EIO;
};

class FaultInjectingEngine final : public ForwardingEngine {
 public:
  FaultInjectingEngine(std::shared_ptr<Engine> target, Faults faults)
      : ForwardingEngine(std::move(target)), faults_(faults) {}

  void write(int fd, const void* buf, size_t len, uint64_t offset, int buf_index,
             Done done) override;
  void read(int fd, void* buf, size_t len, uint64_t offset, int buf_index, Done done) override;
  void readv(int fd, const iovec* iov, int iovcnt, uint64_t offset, Done done) override;
  int open(const std::string& path, int flags, mode_t mode) override;
  int fsync(int fd) override;
  int ftruncate(int fd, uint64_t size) override;
  int mkdir(const std::string& path) override;
  int rename(const std::string& from, const std::string& to, RenameMode mode) override;
  int fsync_dir(const std::string& path) override;

  /// Number of calls of each kind so far.
  int writes() const { return writes_; }
  int fsyncs() const { return fsyncs_; }
  int renames() const { return renames_; }

 private:
  bool hit(std::atomic<int>& counter, int nth) { return ++counter == nth; }

  Faults faults_;
  std::atomic<int> writes_{0}, reads_{0}, fsyncs_{0}, renames_{0}, opens_{0}, truncates_{0},
      mkdirs_{0}, dir_syncs_{0};
  std::atomic<uint64_t> written_{0};
};

}  // namespace tsnap::io
