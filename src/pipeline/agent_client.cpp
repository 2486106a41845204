#include "pipeline/agent_client.h"

#include <unistd.h>

#include <utility>

#include "pipeline/agent_wire.h"
#include "tsnap/error.h"

namespace tsnap::pipeline {

AgentClient::AgentClient(std::filesystem::path socket, const std::filesystem::path& root,
                         bool fall_back)
    : socket_(socket.string()), fall_back_(fall_back) {
  sock_ = agent::connect_to(socket);
  std::lock_guard<std::mutex> lock(mu_);
  io::UniqueFd fd;
  nlohmann::json hello{{"op", "hello"}, {"root", root.string()}, {"pid", ::getpid()}};
  agent::send_frame(sock_.get(), hello, socket_);
  std::optional<nlohmann::json> welcome = agent::recv_frame(sock_.get(), socket_, &fd);
  if (!welcome) {
    throw_error(ErrorCode::kIo, "the snapshot agent at " + socket_ + " closed the link");
  }
  if (welcome->value("op", "") == "refused") {
    throw_error(ErrorCode::kBusy, "the snapshot agent at " + socket_ + " refused root " +
                                      root.string() + ": " + welcome->value("why", ""));
  }
  if (welcome->contains("pool") && fd.valid()) {
    const nlohmann::json& p = welcome->at("pool");
    AdoptedPool a;
    a.fd = std::move(fd);
    a.count = p.at("count").get<size_t>();
    a.buffer_bytes = p.at("buffer_bytes").get<size_t>();
    if (p.contains("hot")) {
      const nlohmann::json& hot = p.at("hot");
      a.hot_name = hot.at("name").get<std::string>();
      a.hot_manifest = hot.at("manifest").get<std::string>();
      a.hot_bufs = hot.at("bufs").get<std::map<std::string, std::vector<int>>>();
    }
    adopted_ = std::move(a);
  }
}

std::optional<AdoptedPool> AgentClient::take_adopted() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(adopted_, std::nullopt);
}

nlohmann::json AgentClient::request(const nlohmann::json& message, bool reply, int fd) {
  if (broken_) {
    throw_error(ErrorCode::kIo, "the link to the snapshot agent at " + socket_ +
                                    " is down (the agent exited or was killed)");
  }
  try {
    agent::send_frame(sock_.get(), message, socket_, fd);
    if (!reply) return {};
    std::optional<nlohmann::json> answer = agent::recv_frame(sock_.get(), socket_);
    if (!answer) {
      throw_error(ErrorCode::kIo, "the snapshot agent at " + socket_ + " closed the link");
    }
    return *answer;
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void AgentClient::share_pool(int fd, size_t count, size_t buffer_bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    request({{"op", "pool"}, {"count", count}, {"buffer_bytes", buffer_bytes}}, false, fd);
  } catch (...) {
  }
}

uint64_t AgentClient::next_seq() {
  std::lock_guard<std::mutex> lock(mu_);
  return ++seq_;
}

void AgentClient::guard(uint64_t seq, const std::string& name, const std::string& text,
                        const nlohmann::json& bufs, bool overwrite) {
  std::lock_guard<std::mutex> lock(mu_);
  const nlohmann::json answer = request({{"op", "guard"},
                                         {"seq", seq},
                                         {"name", name},
                                         {"manifest", text},
                                         {"bufs", bufs},
                                         {"overwrite", overwrite}},
                                        true);
  if (answer.value("op", "") != "guarded" || answer.value("seq", uint64_t{0}) != seq) {
    broken_ = true;
    throw_error(ErrorCode::kIo, "the snapshot agent at " + socket_ + " did not take save " + name +
                                    ": " + answer.value("why", answer.dump()));
  }
}

void AgentClient::done(uint64_t seq, const std::string* manifest) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    nlohmann::json message{{"op", "done"}, {"seq", seq}};
    if (manifest != nullptr) message["manifest"] = *manifest;
    request(message, false);
  } catch (...) {
  }
}

bool AgentClient::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

}  // namespace tsnap::pipeline
