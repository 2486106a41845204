// The distributed hook's trigger polls (policy/rank_triggers.h) end when cancelled, even when
// the poll timer had already expired: a hook whose thread kept polling could never be destroyed.

#include "policy/rank_triggers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace tsnap::policy {
namespace {

// A group of one in which no trigger is ever posted.
class NoTriggers : public dist::Coordinator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string save_id(const std::string& name) override { return name; }
  void publish(const std::string&, const std::string&) override {}
  std::vector<std::string> gather(const std::string&) override { return {}; }
  void decide(const std::string&, const std::string&) override {}
  std::string outcome(const std::string&) override { return ""; }
  void acknowledge(const std::string&) override {}
  void await_acknowledgements(const std::string&, int) noexcept override {}
  int reported_others(const std::string&) noexcept override { return 0; }
  int64_t post_trigger(const std::string&) override { return 0; }
  std::string poll_trigger(int64_t) override {
    ++polls;
    return "";
  }
  std::atomic<int> polls{0};
};

// Runs `io` until it has no work left, for at most 5 s (then stops it): whether it ended.
bool runs_out(boost::asio::io_context& io) {
  std::future<void> ran = std::async(std::launch::async, [&] { io.run(); });
  if (ran.wait_for(std::chrono::seconds(5)) == std::future_status::ready) return true;
  io.stop();
  ran.wait();
  return false;
}

// The race the hook's destructor met: the poll timer expires while the io thread is busy, and
// the cancel is queued before the reactor finds the expiry, so the timer's handler runs after
// the cancel, with success. It must not wait again.
TEST(RankTriggers, ACancelQueuedBeforeAnExpiredPollEndsThePolls) {
  boost::asio::io_context io;
  NoTriggers coord;
  RankTriggers triggers(coord, io, [](const std::string&) {});
  triggers.start_polling();  // one poll now, the next in 50 ms
  boost::asio::post(io, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(120));  // the timer expires
    boost::asio::post(io, [&] { triggers.cancel(); });
  });
  EXPECT_TRUE(runs_out(io)) << "the io_context still had a poll waiting after cancel ("
                            << coord.polls.load() << " polls)";
  EXPECT_LE(coord.polls.load(), 2);
}

// A cancel with the timer still pending ends the polls too.
TEST(RankTriggers, ACancelBeforeTheTimerExpiresEndsThePolls) {
  boost::asio::io_context io;
  NoTriggers coord;
  RankTriggers triggers(coord, io, [](const std::string&) {});
  triggers.start_polling();
  boost::asio::post(io, [&] { triggers.cancel(); });
  EXPECT_TRUE(runs_out(io));
  EXPECT_EQ(coord.polls.load(), 1);
}

}  // namespace
}  // namespace tsnap::policy
