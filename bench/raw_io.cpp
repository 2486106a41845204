#include "bench/raw_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include "bench/measure.h"
#include "common/anon_memory.h"
#include "io/engine_host.h"

namespace fs = std::filesystem;

namespace tsnap::bench {
namespace {

// The transfers' buffers, freed last (after the engine that may have them registered): in
// huge pages faulted in ahead, as tsnap's own buffers are (common/anon_memory.h), so that the
// floor is the device's, not the pinning of 4 KiB pages that each O_DIRECT transfer does (a
// 1.5 GB raw read from 4 KiB pages measured 0.59-1.38 s on the 2-core VM).
struct Buffers {
  std::unique_ptr<detail::AnonMemory> memory;
  std::vector<uint8_t*> p;
};

}  // namespace

struct RawIo::Impl {
  explicit Impl(const RawIoOptions& o)
      : options(o),
        host(io::host_of(o.uring ? EngineKind::kUring : EngineKind::kPwrite, request(o))) {}

  static io::EngineRequest request(const RawIoOptions& o) {
    io::EngineRequest r;
    r.queue_depth = std::max(1u, o.depth);
    r.io_threads = 4;
    return r;
  }

  // Runs `submit(buffer, index, offset, len, done)` for every chunk of [0, bytes), at most
  // min(depth, buffers) in flight, each in a buffer no other transfer uses; returns the first
  // error (negative) or 0. `submit`'s done receives the result.
  template <typename Submit>
  int pump(uint64_t bytes, Submit submit) {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int> free_bufs;
    const size_t limit = std::min<size_t>(options.depth, buffers.p.size());
    for (size_t i = 0; i < std::max<size_t>(1, limit); ++i)
      free_bufs.push_back(static_cast<int>(i));
    size_t in_flight = 0;
    int failed = 0;
    for (uint64_t off = 0; off < bytes;) {
      int b;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !free_bufs.empty(); });
        if (failed) break;
        b = free_bufs.back();
        free_bufs.pop_back();
        ++in_flight;
      }
      const uint64_t n = std::min(options.chunk, (bytes - off + 4095) / 4096 * 4096);
      submit(buffers.p[b], options.register_buffers ? b : -1, off, n, [&, b](int rc) {
        std::lock_guard<std::mutex> lock(mu);
        if (rc < 0 && !failed) failed = rc;
        free_bufs.push_back(b);
        --in_flight;
        cv.notify_one();
      });
      off += n;
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
    return failed;
  }

  RawIoOptions options;
  Buffers buffers;                       // before `host`: destroyed after it
  std::unique_ptr<io::EngineHost> host;  // io::host_of: exactly the engine asked for
};

RawIo::RawIo(const RawIoOptions& options) : impl_(std::make_unique<Impl>(options)) {
  const size_t count = std::max<size_t>(1, options.buffers);
  auto& memory = impl_->buffers.memory;
  memory =
      std::make_unique<detail::AnonMemory>(count * options.chunk, /*huge=*/true, "raw I/O buffers");
  detail::populate_in_parallel(memory->data(), memory->size());
  std::memset(memory->data(), 0x5a, memory->size());
  std::vector<iovec> iovs;
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = memory->data() + i * options.chunk;
    impl_->buffers.p.push_back(p);
    iovs.push_back({p, options.chunk});
  }
  if (options.register_buffers) impl_->host->engine().register_buffers(iovs);
}

RawIo::~RawIo() = default;

std::string RawIo::engine_name() const { return impl_->host->engine().name(); }

double RawIo::write(const std::string& path, uint64_t bytes, bool direct, bool keep) {
  io::Engine& engine = impl_->host->engine();
  const auto t0 = Clock::now();
  const int fd = engine.open(path, O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0) {
    throw std::runtime_error("raw write: cannot open " + path + ": " + std::strerror(-fd));
  }
  int rc =
      impl_->pump(bytes, [&](uint8_t* buf, int index, uint64_t off, uint64_t n, io::Done done) {
        engine.write(fd, buf, n, off, index, std::move(done));
      });
  if (rc == 0) rc = engine.fsync(fd);
  engine.close(fd);
  const double t = since(t0);
  if (rc < 0 || !keep) fs::remove(path);
  if (rc < 0) throw std::runtime_error("raw write of " + path + ": " + std::strerror(-rc));
  return t;
}

double RawIo::read(const std::string& path, bool direct) {
  io::Engine& engine = impl_->host->engine();
  const auto t0 = Clock::now();
  const int fd = engine.open(path, O_RDONLY | (direct ? O_DIRECT : 0), 0);
  if (fd < 0) {
    throw std::runtime_error("raw read: cannot open " + path + ": " + std::strerror(-fd));
  }
  struct stat st {};
  ::fstat(fd, &st);
  const int rc = impl_->pump(static_cast<uint64_t>(st.st_size),
                             [&](uint8_t* buf, int index, uint64_t off, uint64_t n, io::Done done) {
                               engine.read(fd, buf, n, off, index, std::move(done));
                             });
  engine.close(fd);
  const double t = since(t0);
  if (rc < 0) throw std::runtime_error("raw read of " + path + ": " + std::strerror(-rc));
  return t;
}

}  // namespace tsnap::bench
