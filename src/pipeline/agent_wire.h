#pragma once
/// \file
/// The wire between a trainer's Snapshotter and a snapshot agent (pipeline/agent.h): a Unix
/// stream socket carrying frames, each a 4-byte little-endian length and that many bytes of
/// JSON, optionally with one file descriptor attached (SCM_RIGHTS: a staging pool's memfd).
/// The messages themselves are described in agent.cpp.
///
/// Thread-safety: none; each side serialises its own use of a socket. Ownership: the functions
/// take descriptors they do not own; a received descriptor is the caller's.

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "io/fd.h"

namespace tsnap::pipeline::agent {

/// The largest frame accepted (a manifest of a very large state fits many times over).
inline constexpr uint32_t kMaxFrame = 256u << 20;

/// Sends `message`, with descriptor `fd` attached when it is >= 0. Errors: IoError naming
/// `peer` (the socket's path) and errno; a peer that is gone gives EPIPE, never SIGPIPE.
void send_frame(int sock, const nlohmann::json& message, const std::string& peer, int fd = -1);
/// Receives one frame; nullopt when the peer closed the socket between frames. A descriptor
/// that came with it goes into `*fd` (closed when `fd` is null). Errors: IoError naming
/// `peer` for a failed read, a frame cut short, one over kMaxFrame or one that is not JSON.
std::optional<nlohmann::json> recv_frame(int sock, const std::string& peer,
                                         io::UniqueFd* fd = nullptr);
/// A socket connected to the agent listening at `path`. Errors: IoError naming the path.
io::UniqueFd connect_to(const std::filesystem::path& path);
/// A socket listening at `path` (a stale socket file there is replaced; a live agent there is
/// an error). Errors: IoError naming the path.
io::UniqueFd listen_at(const std::filesystem::path& path);

}  // namespace tsnap::pipeline::agent
