#pragma once
// The I/O engine interface: asynchronous whole-buffer writes and reads, plus the few
// synchronous file-system calls of the commit protocol, all behind one narrow interface so a
// test decorator (FaultInjectingEngine) can fail any one of them.
//
// Conventions: every call returns 0 (or a non-negative result) on success and -errno on
// failure; it never throws. write() transfers the whole length (short writes and -EAGAIN are
// resubmitted inside the engine) and then calls `done` exactly once, on an engine thread, with
// 0 or -errno; read() likewise, with the number of bytes read (fewer than asked only at end of
// file) or -errno. Thread-safety: every method may be called from any thread.

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace tsnap::io {

/// Completion of an asynchronous transfer: 0 or -errno.
using Done = std::function<void(int)>;

/// How rename() treats an existing destination.
enum class RenameMode { kNoReplace, kExchange };

class Engine {
 public:
  virtual ~Engine() = default;
  /// "io_uring" or "pwrite" (decorators report their target's name).
  virtual std::string name() const = 0;

  /// Registers the staging buffers once (io_uring fixed buffers; any thread, during transfers); a
  /// no-op where unsupported.
  virtual void register_buffers(const std::vector<iovec>& buffers) {}
  /// Writes `len` bytes from `buf` at `offset` of `fd`. `buf_index` is the registered buffer
  /// it lies in, or -1.
  virtual void write(int fd, const void* buf, size_t len, uint64_t offset, int buf_index,
                     Done done) = 0;
  /// Reads `len` bytes at `offset` (fewer at end of file); done(bytes read or -errno).
  virtual void read(int fd, void* buf, size_t len, uint64_t offset, int buf_index, Done done) = 0;
  /// Reads into `iovcnt` (<= IOV_MAX) segments in turn from `offset`, like read(), but
  /// synchronously: done() is called before it returns (`iov` need not outlive the call). For
  /// reads through the page cache, which are copies, not waits: preadv(2) on the calling
  /// thread, for every engine.
  virtual void readv(int fd, const iovec* iov, int iovcnt, uint64_t offset, Done done);

  /// open(2): returns an fd or -errno.
  virtual int open(const std::string& path, int flags, mode_t mode);
  virtual int close(int fd);
  virtual int fsync(int fd);
  virtual int ftruncate(int fd, uint64_t size);
  virtual int mkdir(const std::string& path);
  /// renameat2(2): kNoReplace fails with -EEXIST if `to` exists; kExchange atomically swaps two
  /// existing paths.
  virtual int rename(const std::string& from, const std::string& to, RenameMode mode);
  /// Opens a directory and fsyncs it.
  virtual int fsync_dir(const std::string& path);
};

/// A decorator that forwards everything to `target` (override only what changes).
class ForwardingEngine : public Engine {
 public:
  explicit ForwardingEngine(std::shared_ptr<Engine> target) : target_(std::move(target)) {}
  std::string name() const override { return target_->name(); }
  void register_buffers(const std::vector<iovec>& b) override { target_->register_buffers(b); }
  void write(int fd, const void* buf, size_t len, uint64_t offset, int buf_index,
             Done done) override {
    target_->write(fd, buf, len, offset, buf_index, std::move(done));
  }
  void read(int fd, void* buf, size_t len, uint64_t offset, int buf_index, Done done) override {
    target_->read(fd, buf, len, offset, buf_index, std::move(done));
  }
  void readv(int fd, const iovec* iov, int iovcnt, uint64_t offset, Done done) override {
    target_->readv(fd, iov, iovcnt, offset, std::move(done));
  }
  int open(const std::string& path, int flags, mode_t mode) override {
    return target_->open(path, flags, mode);
  }
  int close(int fd) override { return target_->close(fd); }
  int fsync(int fd) override { return target_->fsync(fd); }
  int ftruncate(int fd, uint64_t size) override { return target_->ftruncate(fd, size); }
  int mkdir(const std::string& path) override { return target_->mkdir(path); }
  int rename(const std::string& from, const std::string& to, RenameMode mode) override {
    return target_->rename(from, to, mode);
  }
  int fsync_dir(const std::string& path) override { return target_->fsync_dir(path); }
  const std::shared_ptr<Engine>& target() const { return target_; }

 private:
  std::shared_ptr<Engine> target_;
};

/// A pool of `threads` threads calling pwrite/pread, at background priority when `background`
/// (io/thread_priority.h).
std::shared_ptr<Engine> make_pwrite_engine(int threads, bool background = false);

/// An io_uring engine with one ring of `queue_depth` entries whose completions are reaped on
/// `io` (through an eventfd); `io` must be run by a thread and outlive the engine.
/// Returns nullptr (and `*why` set) where io_uring is unavailable (old kernel, seccomp) or
/// disabled by the environment variable TSNAP_DISABLE_IO_URING=1.
std::shared_ptr<Engine> make_uring_engine(boost::asio::io_context& io, unsigned queue_depth,
                                          std::string* why);

/// Writes through `engine` and waits for the completion: 0 or -errno.
int write_and_wait(Engine& engine, int fd, const void* buf, size_t len, uint64_t offset);

/// Name prefix of the probe file probe_direct_io creates where O_TMPFILE is unsupported (a
/// process killed meanwhile leaves `<dir>/.tsnap-direct-probe-<pid>`; writers remove them).
inline constexpr char kDirectProbePrefix[] = ".tsnap-direct-probe-";

/// True when `dir`'s filesystem accepts O_DIRECT writes through `engine` (probed with an
/// unnamed O_TMPFILE file where supported, else a small named file that is removed again).
bool probe_direct_io(Engine& engine, const std::string& dir);

}  // namespace tsnap::io
