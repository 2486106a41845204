#include "pipeline/agent_wire.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "common/sys_error.h"
#include "tsnap/error.h"

namespace tsnap::pipeline::agent {
namespace {

sockaddr_un address(const std::filesystem::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string s = path.string();
  if (s.empty() || s.size() >= sizeof(addr.sun_path)) {
    throw_error(ErrorCode::kInvalidArgument,
                "snapshot agent socket path '" + s + "' is empty or longer than " +
                    std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, s.c_str(), s.size() + 1);
  return addr;
}

// Reads exactly `len` bytes; false at EOF before the first byte when `eof_ok`.
bool read_exact(int sock, uint8_t* p, size_t len, const std::string& peer, bool eof_ok) {
  size_t got = 0;
  while (got < len) {
    const ssize_t n = ::recv(sock, p + got, len - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) detail::throw_sys_error(-errno, "read from the snapshot agent link " + peer);
    if (n == 0) {
      if (got == 0 && eof_ok) return false;
      throw_error(ErrorCode::kIo, "the snapshot agent link " + peer + " closed mid-message");
    }
    got += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

void send_frame(int sock, const nlohmann::json& message, const std::string& peer, int fd) {
  const std::string body = message.dump();
  if (body.size() > kMaxFrame) {
    throw_error(ErrorCode::kInvalidArgument, "a message to the snapshot agent " + peer + " of " +
                                                 std::to_string(body.size()) +
                                                 " bytes exceeds its limit");
  }
  const uint32_t n = static_cast<uint32_t>(body.size());
  uint8_t head[4] = {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)};
  std::vector<uint8_t> frame(head, head + 4);
  frame.insert(frame.end(), body.begin(), body.end());
  size_t sent = 0;
  while (sent < frame.size()) {
    iovec iov{frame.data() + sent, frame.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (sent == 0 && fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    const ssize_t k = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) detail::throw_sys_error(-errno, "write to the snapshot agent link " + peer);
    sent += static_cast<size_t>(k);
  }
}

std::optional<nlohmann::json> recv_frame(int sock, const std::string& peer, io::UniqueFd* fd) {
  uint8_t head[4];
  // The header comes with the descriptor, if any: read it with recvmsg.
  iovec iov{head, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) detail::throw_sys_error(-errno, "read from the snapshot agent link " + peer);
  if (n == 0) return std::nullopt;
  io::UniqueFd received;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int got;
      std::memcpy(&got, CMSG_DATA(c), sizeof(int));
      received.reset(got);
    }
  }
  read_exact(sock, head + 1, 3, peer, /*eof_ok=*/false);
  const uint32_t len = uint32_t(head[0]) | uint32_t(head[1]) << 8 | uint32_t(head[2]) << 16 |
                       uint32_t(head[3]) << 24;
  if (len > kMaxFrame) {
    throw_error(ErrorCode::kIo, "a message on the snapshot agent link " + peer + " claims " +
                                    std::to_string(len) + " bytes, over its limit");
  }
  std::string body(len, '\0');
  read_exact(sock, reinterpret_cast<uint8_t*>(body.data()), len, peer, /*eof_ok=*/false);
  nlohmann::json message = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (message.is_discarded() || !message.is_object()) {
    throw_error(ErrorCode::kIo, "a message on the snapshot agent link " + peer + " is not JSON");
  }
  if (fd != nullptr) *fd = std::move(received);
  return message;
}

io::UniqueFd connect_to(const std::filesystem::path& path) {
  const sockaddr_un addr = address(path);
  io::UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) detail::throw_sys_error(-errno, "create a socket for the snapshot agent");
  if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    detail::throw_sys_error(-errno, "connect to the snapshot agent at " + path.string() +
                                        " (is `tsnap agent --socket " + path.string() +
                                        "` running?)");
  }
  return sock;
}

io::UniqueFd listen_at(const std::filesystem::path& path) {
  const sockaddr_un addr = address(path);
  {
    // A socket file nobody listens at is left by an agent that died: replace it.
    io::UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.valid() &&
        ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      throw_error(ErrorCode::kAlreadyExists,
                  "a snapshot agent is already listening at " + path.string());
    }
    std::error_code ec;
    if (std::filesystem::is_socket(path, ec)) std::filesystem::remove(path, ec);
  }
  io::UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) detail::throw_sys_error(-errno, "create the snapshot agent's socket");
  if (::bind(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    detail::throw_sys_error(-errno, "bind the snapshot agent's socket " + path.string());
  }
  if (::listen(sock.get(), 16) != 0) {
    detail::throw_sys_error(-errno, "listen at the snapshot agent's socket " + path.string());
  }
  return sock;
}

}  // namespace tsnap::pipeline::agent
