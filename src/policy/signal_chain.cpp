#include "policy/signal_chain.h"

#include <string>
#include <utility>

#include "tsnap/error.h"

namespace tsnap::policy {

void SignalChain::install(const std::vector<int>& sigs) {
  for (int sig : sigs) {
    struct sigaction before {};
    ::sigaction(sig, nullptr, &before);
    boost::system::error_code ec;
    signals_.add(sig, ec);
    if (ec) {
      throw_error(ErrorCode::kIo,
                  "cannot handle signal " + std::to_string(sig) + ": " + ec.message(), ec.value());
    }
    previous_[sig] = before;
    struct sigaction now {};
    ::sigaction(sig, nullptr, &now);
    // Asio's own handler (another signal_set already had the signal) is not chained: it
    // would deliver the signal to this set a second time.
    const bool is_function = (before.sa_flags & SA_SIGINFO)
                                 ? before.sa_sigaction != nullptr
                                 : before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN;
    chained_[sig] = is_function && before.sa_handler != now.sa_handler;
    // Asio installs its handler without SA_RESTART; with it, blocking system calls of the
    // training threads resume after the signal instead of failing with EINTR.
    if (!(now.sa_flags & SA_RESTART)) {
      now.sa_flags |= SA_RESTART;
      ::sigaction(sig, &now, nullptr);
    }
  }
}

void SignalChain::start(std::function<void(int sig)> on_signal) {
  on_signal_ = std::move(on_signal);
  wait();
}

void SignalChain::close() {
  closed_ = true;
  signals_.cancel();
  signals_.clear();  // Asio resets each signal to SIG_DFL ...
  restore();         // ... and the previous disposition comes back at once
}

void SignalChain::wait() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;  // cancelled: the hook is shutting down
    // The previous handler first: by the time the training thread acts on the signal (and
    // may stop), it has run.
    chain(sig);
    on_signal_(sig);
    // A signal delivered just before `close` (its handler already queued, which cancelling
    // cannot take back) is the last: waiting again would keep the hook's thread alive.
    if (!closed_) wait();
  });
}

void SignalChain::chain(int sig) {
  struct sigaction& before = previous_[sig];
  if (!chained_[sig]) return;
  if (before.sa_flags & SA_SIGINFO) {
    siginfo_t info{};
    info.si_signo = sig;
    info.si_code = SI_USER;
    before.sa_sigaction(sig, &info, nullptr);
  } else {
    before.sa_handler(sig);
  }
  if (before.sa_flags & SA_RESETHAND) {  // a one-shot handler: the default comes back after it
    before.sa_handler = SIG_DFL;
    before.sa_flags = 0;
    chained_[sig] = false;
  }
}

void SignalChain::restore() {
  for (const auto& [sig, action] : previous_) ::sigaction(sig, &action, nullptr);
}

}  // namespace tsnap::policy
