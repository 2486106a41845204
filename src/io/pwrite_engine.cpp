// The fallback engine: a pool of threads calling pwrite/pread. Used where io_uring or O_DIRECT
// is refused (older tmpfs, seccomp), and as the reference engine in the engine test suite.

#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cerrno>

#include "io/engine.h"
#include "io/thread_priority.h"

namespace tsnap::io {
namespace {

class PwriteEngine final : public Engine {
 public:
  PwriteEngine(int threads, bool background)
      : pool_(static_cast<size_t>(threads < 1 ? 1 : threads)) {
    io::set_up_pool(pool_, static_cast<size_t>(threads < 1 ? 1 : threads), "tsnap-io", background);
  }
  ~PwriteEngine() override { pool_.join(); }

  std::string name() const override { return "pwrite"; }

  void write(int fd, const void* buf, size_t len, uint64_t offset, int, Done done) override {
    boost::asio::post(pool_, [=, done = std::move(done)] {
      const char* p = static_cast<const char*>(buf);
      size_t left = len;
      uint64_t off = offset;
      while (left > 0) {
        const ssize_t n = ::pwrite(fd, p, left, static_cast<off_t>(off));
        if (n < 0) {
          if (errno == EINTR || errno == EAGAIN) continue;
          return done(-errno);
        }
        if (n == 0) return done(-EIO);
        p += n;
        left -= static_cast<size_t>(n);
        off += static_cast<uint64_t>(n);
      }
      done(0);
    });
  }

  void read(int fd, void* buf, size_t len, uint64_t offset, int, Done done) override {
    boost::asio::post(pool_, [=, done = std::move(done)] {
      char* p = static_cast<char*>(buf);
      size_t got = 0;
      while (got < len) {
        const ssize_t n = ::pread(fd, p + got, len - got, static_cast<off_t>(offset + got));
        if (n < 0) {
          if (errno == EINTR || errno == EAGAIN) continue;
          return done(-errno);
        }
        if (n == 0) break;  // end of file
        got += static_cast<size_t>(n);
      }
      done(static_cast<int>(got));
    });
  }

 private:
  boost::asio::thread_pool pool_;
};

}  // namespace

std::shared_ptr<Engine> make_pwrite_engine(int threads, bool background) {
  return std::make_shared<PwriteEngine>(threads, background);
}

}  // namespace tsnap::io
