#pragma once
// A test engine that holds every commit (the rename of the temporary directory) until opened:
// a save stays in flight, its files written, for exactly as long as a test wants.

#include <condition_variable>
#include <mutex>
#include <string>

#include "io/engine.h"

namespace tsnap::test_support {

/// An engine whose renames (the commit of each save) wait until `open_gate()`.
class GateEngine final : public io::ForwardingEngine {
 public:
  GateEngine() : ForwardingEngine(io::make_pwrite_engine(2)) {}
  int rename(const std::string& from, const std::string& to, io::RenameMode mode) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return open_; });
    }
    return ForwardingEngine::rename(from, to, mode);
  }
  void open_gate() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace tsnap::test_support
