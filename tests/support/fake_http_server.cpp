#include "support/fake_http_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace tsnap::test_support {

std::string FakeHttpServer::Exchange::method() const {
  return request_.substr(0, request_.find(' '));
}

std::string FakeHttpServer::Exchange::header(std::string_view name) const {
  for (size_t at = request_.find("\r\n"); at != std::string::npos;) {
    const size_t begin = at + 2;
    const size_t end = request_.find("\r\n", begin);
    if (end == std::string::npos) break;
    const std::string_view line(request_.data() + begin, end - begin);
    const size_t colon = line.find(':');
    if (colon == name.size() && strncasecmp(line.data(), name.data(), name.size()) == 0) {
      std::string_view v = line.substr(colon + 1);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      return std::string(v);
    }
    at = end;
  }
  return {};
}

bool FakeHttpServer::Exchange::send(std::string_view bytes) {
  while (!bytes.empty()) {
    if (stop_) return false;
    pollfd p{fd_, POLLOUT, 0};
    if (::poll(&p, 1, 100) <= 0) continue;  // the client reads slowly (or not at all)
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool FakeHttpServer::Exchange::sleep_ms(int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    if (stop_) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return !stop_;
}

FakeHttpServer::FakeHttpServer(Handler handler) : handler_(std::move(handler)) {
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener_, 64) != 0 ||
      ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("FakeHttpServer: listen on 127.0.0.1");
    std::abort();
  }
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ++connections_;
      std::lock_guard<std::mutex> lock(mu_);
      open_.push_back(fd);
      workers_.emplace_back([this, fd] { serve(fd); });
    }
  });
}

FakeHttpServer::~FakeHttpServer() {
  stop_ = true;
  acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
  }
  for (std::thread& t : workers_) t.join();
  for (int fd : open_) ::close(fd);
  ::close(listener_);
}

std::string FakeHttpServer::endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

void FakeHttpServer::serve(int fd) {
  Exchange x(fd, stop_);
  // The request's head; a body (small, in these tests) is left unread.
  char buf[4096];
  while (x.request_.find("\r\n\r\n") == std::string::npos && x.request_.size() < (1 << 20)) {
    pollfd p{fd, POLLIN, 0};
    if (stop_) return;
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return;
    x.request_.append(buf, static_cast<size_t>(n));
  }
  handler_(x);
  ::shutdown(fd, SHUT_WR);
}

}  // namespace tsnap::test_support
