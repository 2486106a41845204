#include "io/engine_host.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <mutex>
#include <optional>
#include <thread>

#include "common/thread_name.h"
#include "io/thread_priority.h"
#include "tsnap/error.h"

namespace tsnap::io {
namespace {

std::mutex override_mu;
std::shared_ptr<Engine>& override_engine() {
  static std::shared_ptr<Engine> engine;
  return engine;
}

std::shared_ptr<Engine> current_override() {
  std::lock_guard<std::mutex> lock(override_mu);
  return override_engine();
}

}  // namespace

struct EngineHost::Thread {
  boost::asio::io_context io;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::thread thread;

  explicit Thread(bool background)
      : work(io.get_executor()), thread([this, background] {
          detail::name_this_thread("tsnap-io");
          if (background) io::make_background_thread();
          io.run();
        }) {}
  ~Thread() {
    work.reset();
    thread.join();
  }
};

EngineHost::EngineHost() = default;

EngineHost::~EngineHost() {
  engine_.reset();  // an io_uring engine closes its ring on the io thread
  thread_.reset();
}

std::string EngineHost::name() const { return engine_->name() + (direct_ ? "+O_DIRECT" : ""); }

std::shared_ptr<Engine> EngineHost::start_uring(const EngineRequest& request, std::string* why) {
  thread_ = std::make_unique<Thread>(request.background);
  std::shared_ptr<Engine> engine = make_uring_engine(thread_->io, request.queue_depth, why);
  if (!engine) thread_.reset();
  return engine;
}

namespace {

[[noreturn]] void no_uring(const std::string& why) {
  throw_error(ErrorCode::kUnsupported, "io_uring is not available here: " + why);
}

}  // namespace

std::unique_ptr<EngineHost> host_for_save(const EngineRequest& request, bool direct_io,
                                          const std::string& dir) {
  std::unique_ptr<EngineHost> host(new EngineHost());
  if (std::shared_ptr<Engine> forced = current_override()) {
    host->engine_ = std::move(forced);
    host->direct_ = direct_io && probe_direct_io(*host->engine_, dir);
    return host;
  }
  if (request.kind != EngineKind::kPwrite) {
    std::string why;
    host->engine_ = host->start_uring(request, &why);
    if (!host->engine_ && request.kind == EngineKind::kUring) no_uring(why);
    if (host->engine_) {
      host->direct_ = direct_io && probe_direct_io(*host->engine_, dir);
      // kAuto: where O_DIRECT is refused (older tmpfs, some FUSE and network filesystems), the
      // pwrite engine serves as well.
      if (!host->direct_ && request.kind == EngineKind::kAuto && direct_io) {
        host->engine_.reset();
        host->thread_.reset();
      }
    }
  }
  if (!host->engine_) {
    host->engine_ = make_pwrite_engine(request.io_threads, request.background);
    host->direct_ = direct_io && probe_direct_io(*host->engine_, dir);
  }
  return host;
}

std::unique_ptr<EngineHost> host_for_load(const EngineRequest& request, bool any_direct) {
  std::unique_ptr<EngineHost> host(new EngineHost());
  host->direct_ = any_direct;
  if (std::shared_ptr<Engine> forced = current_override()) {
    host->engine_ = std::move(forced);
    return host;
  }
  if (request.kind == EngineKind::kUring || (request.kind == EngineKind::kAuto && any_direct)) {
    std::string why;
    host->engine_ = host->start_uring(request, &why);
    if (!host->engine_ && request.kind == EngineKind::kUring) no_uring(why);
  }
  if (!host->engine_) host->engine_ = make_pwrite_engine(request.io_threads, request.background);
  return host;
}

std::unique_ptr<EngineHost> host_of(EngineKind kind, const EngineRequest& request) {
  std::unique_ptr<EngineHost> host(new EngineHost());
  if (kind == EngineKind::kPwrite) {
    host->engine_ = make_pwrite_engine(request.io_threads, request.background);
    return host;
  }
  std::string why;
  host->engine_ = host->start_uring(request, &why);
  if (!host->engine_) no_uring(why);
  return host;
}

ScopedEngineOverride::ScopedEngineOverride(std::shared_ptr<Engine> engine) {
  std::lock_guard<std::mutex> lock(override_mu);
  override_engine() = std::move(engine);
}

ScopedEngineOverride::~ScopedEngineOverride() {
  std::lock_guard<std::mutex> lock(override_mu);
  override_engine().reset();
}

}  // namespace tsnap::io
