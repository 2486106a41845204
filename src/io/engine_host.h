#pragma once
// An io engine together with what keeps it running: for io_uring, the io thread whose
// io_context reaps the ring's completions (through an eventfd). The save path, the read path
// and the benchmarks all get their engine from here, through one of the three selection
// policies below, so "which engine, and is O_DIRECT on" is decided in one place.
//
// Thread-safety: a host is not copied or moved; engine() may be used from any thread.
// Lifetime: the destructor releases the engine first (an io_uring engine closes its ring on
// the io thread) and then stops and joins the io thread. Every transfer must have completed.

#include <memory>
#include <string>

#include "io/engine.h"
#include "tsnap/engine_kind.h"

namespace tsnap::io {

/// What the caller asks of an engine.
struct EngineRequest {
  EngineKind kind = EngineKind::kAuto;
  unsigned queue_depth = 32;  ///< io_uring ring entries.
  int io_threads = 4;         ///< Threads of the pwrite/pread engine.
  /// Run the engine's threads (the io thread, the pwrite pool) at background priority
  /// (io/thread_priority.h).
  bool background = false;
};

class EngineHost {
 public:
  ~EngineHost();
  EngineHost(const EngineHost&) = delete;
  EngineHost& operator=(const EngineHost&) = delete;

  Engine& engine() const { return *engine_; }
  const std::shared_ptr<Engine>& shared_engine() const { return engine_; }
  /// Whether transfers should use O_DIRECT descriptors (as decided by the policy).
  bool direct() const { return direct_; }
  /// "io_uring", "pwrite", with "+O_DIRECT" when direct().
  std::string name() const;

 private:
  struct Thread;
  EngineHost();
  friend std::unique_ptr<EngineHost> host_for_save(const EngineRequest&, bool, const std::string&);
  friend std::unique_ptr<EngineHost> host_for_load(const EngineRequest&, bool);
  friend std::unique_ptr<EngineHost> host_of(EngineKind, const EngineRequest&);
  // Starts the io thread and builds an io_uring engine; nullptr and `*why` when unavailable.
  std::shared_ptr<Engine> start_uring(const EngineRequest& request, std::string* why);

  std::unique_ptr<Thread> thread_;
  std::shared_ptr<Engine> engine_;
  bool direct_ = false;
};

/// The save policy: kPwrite takes the pwrite pool; kUring takes io_uring or throws
/// Error(kUnsupported) saying why; kAuto takes io_uring where it is available and, when
/// `direct_io`, where `dir`'s filesystem accepts O_DIRECT (probed), else the pwrite pool (which
/// serves buffered writes as well and needs no io thread). direct() is `direct_io` and the
/// probe's answer.
std::unique_ptr<EngineHost> host_for_save(const EngineRequest& request, bool direct_io,
                                          const std::string& dir);

/// The load policy: kUring takes io_uring or throws Error(kUnsupported); kAuto takes io_uring
/// only when some file will be read with O_DIRECT (`any_direct`), else a pread pool, whose
/// copies then run on several threads instead of the ring's one. direct() is `any_direct`.
std::unique_ptr<EngineHost> host_for_load(const EngineRequest& request, bool any_direct);

/// Exactly `kind` (kUring or kPwrite; kAuto means kUring): for measurements of one engine.
/// Throws Error(kUnsupported) where io_uring is unavailable. direct() is false.
std::unique_ptr<EngineHost> host_of(EngineKind kind, const EngineRequest& request);

/// Test hook (tensorstore-style): while an instance lives, every host built by the save and
/// load policies runs `engine` instead of choosing one (e.g. a fault injector wrapping a real
/// engine); the direct-I/O probe still runs against it. Not thread-safe against hosts being
/// built concurrently; instances do not nest.
class ScopedEngineOverride {
 public:
  explicit ScopedEngineOverride(std::shared_ptr<Engine> engine);
  ~ScopedEngineOverride();
  ScopedEngineOverride(const ScopedEngineOverride&) = delete;
  ScopedEngineOverride& operator=(const ScopedEngineOverride&) = delete;
};

}  // namespace tsnap::io
