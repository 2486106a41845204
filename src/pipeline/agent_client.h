#pragma once
/// \file
/// A Snapshotter's side of the link to a snapshot agent (pipeline/agent.h): says hello for
/// its root (and adopts the pool a killed trainer of that root left with the agent), shares
/// its staging pool's memory, hands each save over once it is staged (guard) and says how it
/// ended (done).
///
/// Thread-safety: all methods are thread-safe (one request at a time on the link).
/// Ownership: owns the socket; a link that failed once stays failed (broken()).

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/fd.h"

namespace tsnap::pipeline {

/// What a trainer of the same root left with the agent: its staging pool (a memfd) and the
/// last snapshot it committed, still in that pool's buffers.
struct AdoptedPool {
  io::UniqueFd fd;
  size_t count = 0;
  size_t buffer_bytes = 0;
  std::string hot_name;                              ///< empty: no snapshot in it
  std::string hot_manifest;                          ///< the manifest's text as committed
  std::map<std::string, std::vector<int>> hot_bufs;  ///< per file: each chunk's buffer
};

class AgentClient {
 public:
  /// Connects to the agent at `socket` and says hello for `root` (absolute). Blocks while the
  /// agent commits what a killed trainer of the root left. Errors: IoError naming the socket
  /// (no agent there); Error(kBusy) when a live trainer holds the root at that agent.
  AgentClient(std::filesystem::path socket, const std::filesystem::path& root, bool fall_back);

  const std::string& socket() const { return socket_; }
  /// SnapshotterOptions::agent.fall_back.
  bool fall_back() const { return fall_back_; }
  /// The pool to adopt, once (empty when there was none or it was taken).
  std::optional<AdoptedPool> take_adopted();
  /// Shares a new pool; failures mark the link broken (the next guard says so).
  void share_pool(int fd, size_t count, size_t buffer_bytes) noexcept;
  /// A fresh sequence number for a save.
  uint64_t next_seq();
  /// Hands save `seq` (`name`, its manifest `text` with the chunk hashes still zero, and
  /// `bufs`: per file, each chunk's buffer) to the agent; returns once the agent holds it.
  /// Errors: IoError naming the socket when the link is or goes down.
  void guard(uint64_t seq, const std::string& name, const std::string& text,
             const nlohmann::json& bufs, bool overwrite);
  /// Save `seq` ended: committed with `manifest` (its text as committed), or failed (null).
  /// Best effort: a failure marks the link broken.
  void done(uint64_t seq, const std::string* manifest) noexcept;
  bool broken() const;

 private:
  // Sends `message` (and reads the reply when `reply`); throws IoError and marks the link
  // broken on failure. Called with mu_ held.
  nlohmann::json request(const nlohmann::json& message, bool reply, int fd = -1);

  const std::string socket_;
  const bool fall_back_;
  mutable std::mutex mu_;
  io::UniqueFd sock_;
  bool broken_ = false;
  uint64_t seq_ = 0;
  std::optional<AdoptedPool> adopted_;
};

}  // namespace tsnap::pipeline
