#pragma once
// Writes held back while an eager save stages (SaveJob): its chunks' writes start once its
// staging ends, so that the io thread's writes and hashes do not share the cores and the memory
// bandwidth with the copy the caller waits for. One save at a time holds writes back, and a
// thread that finds no free staging buffer releases them (the staging pool's reclaim hook, set
// by the Snapshotter): the buffers they hold come back once written. So every wait for a buffer
// ends, whichever save's chunk waits and whichever thread runs it (a thread waiting for its
// own save's staging runs other saves' chunks in the same TBB arena).

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace tsnap::pipeline {

class DeferredWrites {
 public:
  /// Starts holding writes back for one save: its ticket, or 0 when another save holds writes
  /// back already.
  uint64_t begin();
  /// Holds `write` (which must not throw) under `ticket`; false when the ticket's writes were
  /// released meanwhile: the caller writes now.
  bool hold(uint64_t ticket, std::function<void()> write);
  /// Ends `ticket` (its save's staging is over): runs the writes it still holds, on the
  /// calling thread. A no-op for 0 or a ticket already released.
  void release(uint64_t ticket);
  /// Runs whatever writes are held, whoever holds them (a wait for a staging buffer).
  void release_any();

 private:
  // Ends the active ticket and runs its writes if it is `ticket`, or whichever it is for 0.
  void release_matching(uint64_t ticket);
  std::mutex mu_;
  uint64_t last_ = 0;    // the last ticket handed out
  uint64_t active_ = 0;  // the ticket holding writes back; 0: none
  std::vector<std::function<void()>> writes_;
};

}  // namespace tsnap::pipeline
