#pragma once
/// \file
/// The signals a periodic hook stops on (`Schedule` options `on_signals`), handled through an
/// Asio `signal_set` and chained to the handlers installed before: each signal runs the previous
/// handler first, then the hook's callback; `close` puts the previous dispositions back.
///
/// Thread-safety: `install` and `start` run before the io_context's thread does (the hook's
/// constructor); the callback runs on that thread, and `close` runs on it too (or where it never
/// ran). Ownership: the chain refers to the io_context, which must outlive it.

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <functional>
#include <map>
#include <vector>

namespace tsnap::policy {

class SignalChain {
 public:
  explicit SignalChain(boost::asio::io_context& io) : signals_(io) {}
  SignalChain(const SignalChain&) = delete;
  SignalChain& operator=(const SignalChain&) = delete;

  /// Handles each of `sigs` (with SA_RESTART, so the training threads' blocking system calls
  /// resume after it), remembering its disposition before. Errors: IoError(kIo) naming a signal
  /// that cannot be handled; the signals added before it stay, for `close`.
  void install(const std::vector<int>& sigs);

  /// Waits for the signals: at each, the previous handler runs (when it is a function other than
  /// Asio's own), then `on_signal(sig)`.
  void start(std::function<void(int sig)> on_signal);

  /// Cancels the wait, stops handling the signals and restores their previous dispositions.
  void close();

 private:
  void wait();
  void chain(int sig);
  void restore();

  boost::asio::signal_set signals_;
  std::map<int, struct sigaction> previous_;  // dispositions before the hook: chained, restored
  std::map<int, bool> chained_;               // whether `previous_` is a handler to call
  std::function<void(int)> on_signal_;
  bool closed_ = false;  // a signal already queued when `close` ran is not waited for again
};

}  // namespace tsnap::policy
