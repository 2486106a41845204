#pragma once
// A scripted HTTP server on 127.0.0.1 for tests of hostile or broken endpoints (a body that
// never ends, an answer that never comes or trickles in, oversized or malformed documents):
//
//   FakeHttpServer server([](FakeHttpServer::Exchange& x) {
//     x.send("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
//     while (x.send(std::string(65536, 'x'))) {}  // until the client hangs up or the test ends
//   });
//   config.endpoint = server.endpoint();

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace tsnap::test_support {

/// Serves each connection on its own thread with the test's handler, one request per
/// connection (the handler's answer should say `Connection: close`).
/// Thread-safety: the handler runs on server threads, concurrently for concurrent connections.
/// Ownership: owns its threads and sockets; the destructor stops the handlers (send fails and
/// stopping() turns true) and joins them.
class FakeHttpServer {
 public:
  /// One connection: the request's head (request line and headers) and ways to answer.
  class Exchange {
   public:
    /// "GET /bucket/key?query HTTP/1.1\r\nhost: ...\r\n...\r\n\r\n".
    const std::string& request() const { return request_; }
    /// The request's method ("GET", "HEAD", ...).
    std::string method() const;
    /// The value of request header `name` (case-insensitive), "" when absent.
    std::string header(std::string_view name) const;
    /// Sends `bytes`; false once the client is gone or the server stops.
    bool send(std::string_view bytes);
    /// Sleeps `ms` milliseconds; false (at once) when the server stops.
    bool sleep_ms(int ms);

   private:
    friend class FakeHttpServer;
    Exchange(int fd, const std::atomic<bool>& stop) : fd_(fd), stop_(stop) {}
    int fd_;
    const std::atomic<bool>& stop_;
    std::string request_;
  };
  using Handler = std::function<void(Exchange&)>;

  /// Listens on a free port of 127.0.0.1. Aborts the test program when it cannot.
  explicit FakeHttpServer(Handler handler);
  ~FakeHttpServer();
  FakeHttpServer(const FakeHttpServer&) = delete;
  FakeHttpServer& operator=(const FakeHttpServer&) = delete;

  /// "http://127.0.0.1:PORT".
  std::string endpoint() const;
  /// Connections accepted so far.
  int connections() const { return connections_; }

 private:
  void serve(int fd);

  Handler handler_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> open_;
  std::vector<std::thread> workers_;
};

}  // namespace tsnap::test_support
