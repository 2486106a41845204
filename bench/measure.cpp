#include "measure.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "io/engine.h"

namespace fs = std::filesystem;

namespace tsnap::bench {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Series::median() const {
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  if (s.empty()) return 0;
  return s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
}
double Series::min() const { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double Series::max() const { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

long rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}

long peak_rss_kib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

double process_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

uint64_t output_bytes(const StateDict& sd, std::optional<at::ScalarType> dtype) {
  uint64_t n = 0;
  for (const auto& [k, e] : sd) {
    const bool floating = at::isFloatingType(e.tensor.scalar_type());
    n +=
        e.tensor.numel() * (dtype && floating ? c10::elementSize(*dtype) : e.tensor.element_size());
  }
  return n;
}

struct RawIo::Impl {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard{
      boost::asio::make_work_guard(io)};
  std::thread io_thread;
  std::shared_ptr<io::Engine> engine;
  std::vector<uint8_t*> bufs;
  uint64_t chunk = 0;
  unsigned depth = 0;

  // Runs `submit(buffer, offset, len, done)` for every chunk of [0, bytes), at most `depth` in
  // flight; returns the first error (negative) or 0. `submit`'s done receives the result.
  template <typename Submit>
  int pump(uint64_t bytes, Submit submit) {
    std::mutex mu;
    std::condition_variable cv;
    unsigned in_flight = 0;
    int failed = 0;
    uint64_t off = 0;
    size_t next_buf = 0;
    const size_t limit = std::min<size_t>(depth, bufs.size());
    while (off < bytes) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return in_flight < limit; });
        if (failed) break;
        ++in_flight;
      }
      const uint64_t n = std::min(chunk, (bytes - off + 4095) / 4096 * 4096);
      submit(bufs[next_buf++ % bufs.size()], off, n, [&](int rc) {
        std::lock_guard<std::mutex> lock(mu);
        if (rc < 0 && !failed) failed = rc;
        --in_flight;
        cv.notify_one();
      });
      off += n;
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
    return failed;
  }
};

RawIo::RawIo(bool uring, unsigned depth, uint64_t chunk, size_t buffers)
    : impl_(std::make_unique<Impl>()) {
  impl_->chunk = chunk;
  impl_->depth = std::max(1u, depth);
  impl_->io_thread = std::thread([this] { impl_->io.run(); });
  std::string why;
  impl_->engine =
      uring ? io::make_uring_engine(impl_->io, impl_->depth, &why) : io::make_pwrite_engine(4);
  if (!impl_->engine) {
    impl_->guard.reset();
    impl_->io_thread.join();
    throw std::runtime_error("io_uring unavailable: " + why);
  }
  for (size_t i = 0; i < std::max<size_t>(1, buffers); ++i) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, chunk) != 0) throw std::bad_alloc();
    std::memset(p, 0x5a, chunk);
    impl_->bufs.push_back(static_cast<uint8_t*>(p));
  }
}

RawIo::~RawIo() {
  impl_->engine.reset();
  impl_->guard.reset();
  impl_->io_thread.join();
  for (uint8_t* p : impl_->bufs) std::free(p);
}

std::string RawIo::engine_name() const { return impl_->engine->name(); }

double RawIo::write(const std::string& path, uint64_t bytes, bool direct, bool keep) {
  io::Engine& engine = *impl_->engine;
  const auto t0 = Clock::now();
  const int fd = engine.open(path, O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0) {
    throw std::runtime_error("raw write: cannot open " + path + ": " + std::strerror(-fd));
  }
  int rc = impl_->pump(bytes, [&](uint8_t* buf, uint64_t off, uint64_t n, io::Done done) {
    engine.write(fd, buf, n, off, -1, std::move(done));
  });
  if (rc == 0) rc = engine.fsync(fd);
  engine.close(fd);
  const double t = since(t0);
  if (rc < 0 || !keep) fs::remove(path);
  if (rc < 0) throw std::runtime_error("raw write of " + path + ": " + std::strerror(-rc));
  return t;
}

double RawIo::read(const std::string& path, bool direct) {
  io::Engine& engine = *impl_->engine;
  const auto t0 = Clock::now();
  const int fd = engine.open(path, O_RDONLY | (direct ? O_DIRECT : 0), 0);
  if (fd < 0) {
    throw std::runtime_error("raw read: cannot open " + path + ": " + std::strerror(-fd));
  }
  struct stat st {};
  ::fstat(fd, &st);
  const int rc = impl_->pump(static_cast<uint64_t>(st.st_size),
                             [&](uint8_t* buf, uint64_t off, uint64_t n, io::Done done) {
                               engine.read(fd, buf, n, off, -1, std::move(done));
                             });
  engine.close(fd);
  const double t = since(t0);
  if (rc < 0) throw std::runtime_error("raw read of " + path + ": " + std::strerror(-rc));
  return t;
}

double memcpy_2threads(const StateDict& sd, std::optional<at::ScalarType> dtype, uint8_t* dst) {
  // The same output bytes: for a converted state, copy as many source bytes as the convert
  // writes, so that the floor counts output bandwidth only.
  std::vector<std::pair<const uint8_t*, uint64_t>> pieces;
  for (const auto& [k, e] : sd) {
    const uint64_t out = e.tensor.numel() * (dtype && at::isFloatingType(e.tensor.scalar_type())
                                                 ? c10::elementSize(*dtype)
                                                 : e.tensor.element_size());
    pieces.push_back({static_cast<const uint8_t*>(e.tensor.data_ptr()), out});
  }
  std::vector<uint64_t> offsets(pieces.size() + 1, 0);
  for (size_t i = 0; i < pieces.size(); ++i) offsets[i + 1] = offsets[i] + pieces[i].second;
  const auto t0 = Clock::now();
  std::thread threads[2];
  for (int t = 0; t < 2; ++t) {
    threads[t] = std::thread([&, t] {
      for (size_t i = t; i < pieces.size(); i += 2) {
        std::memcpy(dst + offsets[i], pieces[i].first, pieces[i].second);
      }
    });
  }
  for (auto& th : threads) th.join();
  return since(t0);
}

double torch_save_fsync(const StateDict& sd, const std::string& path, bool keep) {
  std::vector<at::Tensor> tensors;
  for (const auto& [k, e] : sd) tensors.push_back(e.tensor);
  const auto t0 = Clock::now();
  try {
    torch::save(tensors, path);
  } catch (...) {
    fs::remove(path);
    throw;
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  const int rc = fd < 0 ? -1 : ::fsync(fd);
  if (fd >= 0) ::close(fd);
  const double t = since(t0);
  if (rc != 0 || !keep) fs::remove(path);
  if (rc != 0) throw std::runtime_error("torch::save: fsync of " + path + " failed");
  return t;
}

double torch_load(const std::string& path) {
  std::vector<at::Tensor> tensors;
  const auto t0 = Clock::now();
  torch::load(tensors, path);
  return since(t0);
}

}  // namespace tsnap::bench
