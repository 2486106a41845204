// The io_uring engine: one ring, driven from the io thread's Asio io_context. Submissions from
// any thread are posted to the io thread, which queues them while the ring is full, prepares
// SQEs (fixed-buffer writes/reads from the registered staging pool where possible) and submits.
// The kernel signals completions on an eventfd that the io_context watches; the handler reaps
// every CQE, requeues short transfers with the remainder and -EAGAIN/-EINTR as they were, and
// completes the rest (0, bytes read, or -errno) through the request's callback.

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>

#include "io/engine.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSNAP_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(TSNAP_TSAN)
#define TSNAP_TSAN 1
#endif
#ifdef TSNAP_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace tsnap::io {
namespace {

namespace asio = boost::asio;

// ThreadSanitizer does not see liburing map and unmap a ring's memory (it makes the system calls
// itself), so what it recorded for a closed ring's memory outlives the ring, and a new ring that
// the kernel maps at the same address reports races with the old ring's io thread (seen in the
// restore suite: io_uring_prep_write on a save's ring vs io_uring_prep_read on a finished
// load's). The kernel orders the two: an address is reused only after its previous mapping is
// gone. These two calls tell TSan so; they do nothing in other builds.
#ifdef TSNAP_TSAN
char ring_memory_token;
void before_ring_unmapped() { __tsan_release(&ring_memory_token); }
void after_ring_mapped() { __tsan_acquire(&ring_memory_token); }
#else
void before_ring_unmapped() {}
void after_ring_mapped() {}
#endif

struct Request {
  bool is_write;
  int fd;
  char* buf;
  size_t len;
  uint64_t offset;
  int buf_index;
  size_t done_bytes = 0;
  Done done;
};

class UringEngine final : public Engine {
 public:
  // Takes ownership of an initialised `ring` (moved in by value: liburing's struct holds no
  // pointers to itself) and of `efd`, registered with it.
  UringEngine(asio::io_context& io, unsigned depth, const io_uring& ring, int efd)
      : io_(io), ring_(ring), depth_(depth), eventfd_(io, efd) {
    arm();
  }

  ~UringEngine() override {
    // Close the eventfd watcher on the io thread (where its handler runs), then the ring. A
    // handler already queued with success when the watcher closes (closing cannot take it
    // back) runs before the second post: it finds the watcher closed and touches nothing.
    std::promise<void> closed;
    asio::post(io_, [&] {
      boost::system::error_code ignored;
      eventfd_.close(ignored);
      asio::post(io_, [&] { closed.set_value(); });
    });
    closed.get_future().wait();
    before_ring_unmapped();
    io_uring_queue_exit(&ring_);
  }

  std::string name() const override { return "io_uring"; }

  void register_buffers(const std::vector<iovec>& buffers) override {
    std::promise<void> registered;
    asio::post(io_, [&] {
      fixed_ = io_uring_register_buffers(&ring_, buffers.data(),
                                         static_cast<unsigned>(buffers.size())) == 0;
      registered.set_value();
    });
    registered.get_future().wait();
  }

  void write(int fd, const void* buf, size_t len, uint64_t offset, int buf_index,
             Done done) override {
    submit(new Request{true, fd, static_cast<char*>(const_cast<void*>(buf)), len, offset, buf_index,
                       0, std::move(done)});
  }

  void read(int fd, void* buf, size_t len, uint64_t offset, int buf_index, Done done) override {
    submit(new Request{false, fd, static_cast<char*>(buf), len, offset, buf_index, 0,
                       std::move(done)});
  }

 private:
  void submit(Request* r) {
    asio::post(io_, [this, r] {
      queued_.push_back(r);
      flush();
    });
  }

  // io thread: move queued requests into the ring while it has room.
  void flush() {
    bool any = false;
    while (!queued_.empty() && in_flight_ < depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      Request* r = queued_.front();
      queued_.pop_front();
      char* p = r->buf + r->done_bytes;
      const unsigned n = static_cast<unsigned>(r->len - r->done_bytes);
      const uint64_t off = r->offset + r->done_bytes;
      if (fixed_ && r->buf_index >= 0) {
        if (r->is_write) {
          io_uring_prep_write_fixed(sqe, r->fd, p, n, off, r->buf_index);
        } else {
          io_uring_prep_read_fixed(sqe, r->fd, p, n, off, r->buf_index);
        }
      } else if (r->is_write) {
        io_uring_prep_write(sqe, r->fd, p, n, off);
      } else {
        io_uring_prep_read(sqe, r->fd, p, n, off);
      }
      io_uring_sqe_set_data(sqe, r);
      ++in_flight_;
      any = true;
    }
    if (any || unsubmitted_) submit_prepared();
  }

  // SQEs the kernel did not take stay in the SQ and go with the next submit. A transient
  // refusal (EAGAIN, EBUSY, EINTR) is retried from the io_context; any other error means the
  // ring is unusable: queued requests fail with it (prepared ones stay in the SQ, as the
  // kernel owns them now, and complete if the ring ever recovers).
  void submit_prepared() {
    const int rc = io_uring_submit(&ring_);
    unsubmitted_ = rc < 0;
    if (rc >= 0) return;
    if (rc == -EAGAIN || rc == -EBUSY || rc == -EINTR) {
      asio::post(io_, [this] { flush(); });
      return;
    }
    while (!queued_.empty()) {
      Request* r = queued_.front();
      queued_.pop_front();
      finish(r, rc);
    }
  }

  void arm() {
    eventfd_.async_wait(asio::posix::stream_descriptor::wait_read,
                        [this](const boost::system::error_code& ec) {
                          if (ec || !eventfd_.is_open()) return;  // closed
                          uint64_t count;
                          (void)::read(eventfd_.native_handle(), &count, sizeof count);
                          reap();
                          flush();
                          arm();
                        });
  }

  void reap() {
    io_uring_cqe* cqe;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
      auto* r = static_cast<Request*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
      complete(r, res);
    }
  }

  void complete(Request* r, int res) {
    if (res == -EAGAIN || res == -EINTR) {
      queued_.push_back(r);  // retry as it was
      return;
    }
    if (res < 0) return finish(r, res);
    r->done_bytes += static_cast<size_t>(res);
    if (res == 0) {  // end of file (read) or no progress (write)
      return finish(r, r->is_write ? -EIO : static_cast<int>(r->done_bytes));
    }
    if (r->done_bytes < r->len) {
      queued_.push_back(r);  // short transfer: resubmit the remainder
      return;
    }
    finish(r, r->is_write ? 0 : static_cast<int>(r->done_bytes));
  }

  static void finish(Request* r, int res) {
    Done done = std::move(r->done);
    delete r;
    done(res);
  }

  asio::io_context& io_;
  io_uring ring_;
  unsigned depth_;
  unsigned in_flight_ = 0;
  bool fixed_ = false;
  bool unsubmitted_ = false;
  std::deque<Request*> queued_;
  asio::posix::stream_descriptor eventfd_;
};

}  // namespace

std::shared_ptr<Engine> make_uring_engine(asio::io_context& io, unsigned queue_depth,
                                          std::string* why) {
  const char* off = std::getenv("TSNAP_DISABLE_IO_URING");
  if (off != nullptr && *off != '\0' && std::string(off) != "0") {
    if (why) *why = "disabled by TSNAP_DISABLE_IO_URING";
    return nullptr;
  }
  io_uring ring;
  const unsigned depth = queue_depth == 0 ? 32 : queue_depth;
  int rc = io_uring_queue_init(depth, &ring, 0);
  if (rc < 0) {
    if (why) *why = std::string("io_uring_queue_init: ") + std::strerror(-rc);
    return nullptr;
  }
  after_ring_mapped();
  const int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) {
    if (why) *why = std::string("eventfd: ") + std::strerror(errno);
    io_uring_queue_exit(&ring);
    return nullptr;
  }
  rc = io_uring_register_eventfd(&ring, efd);
  if (rc < 0) {
    if (why) *why = std::string("io_uring_register_eventfd: ") + std::strerror(-rc);
    ::close(efd);
    io_uring_queue_exit(&ring);
    return nullptr;
  }
  return std::make_shared<UringEngine>(io, depth, ring, efd);
}

}  // namespace tsnap::io
