// The snapshot agent (tsnap/agent.h). Messages on a link (pipeline/agent_wire.h), trainer to
// agent, each a JSON object with "op":
//   hello {root, pid}         -> welcome {pool: {count, buffer_bytes, hot: {name, manifest,
//                                bufs}}} with the pool's memfd, when a dead trainer of the
//                                root left one; or refused {why}
//   pool {count, buffer_bytes} + memfd: the trainer's (new) staging pool
//   guard {seq, name, manifest, bufs, overwrite} -> guarded {seq}: the agent holds the save
//   done {seq, manifest?}     the save committed (with the manifest as committed) or failed
// When a link closes without the agent closing it, the trainer is gone (a process's sockets
// close only once it has stopped running, so no rename of its own can follow): the agent
// commits each save it holds for that link, oldest first, unless the trainer committed it.

#include "tsnap/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "common/anon_memory.h"
#include "common/hidden.h"
#include "common/sys_error.h"
#include "common/thread_name.h"
#include "format/hash.h"
#include "format/layout.h"
#include "format/manifest_io.h"
#include "pipeline/agent_wire.h"
#include "pipeline/commit.h"
#include "pipeline/root_lock.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"

namespace fs = std::filesystem;

namespace tsnap {
namespace {

// A trainer's staging pool, mapped here too.
struct Pool {
  std::unique_ptr<detail::AnonMemory> memory;
  size_t count = 0;
  size_t buffer_bytes = 0;
  const uint8_t* buffer(int b) const { return memory->data() + size_t(b) * buffer_bytes; }
};

// A save in a pool: handed over (manifest with zero hashes) or committed (as committed).
struct Held {
  std::string name;
  std::string manifest;
  std::map<std::string, std::vector<int>> bufs;
  bool overwrite = false;
};

struct RootState {
  std::shared_ptr<Pool> pool;
  std::map<uint64_t, Held> guarded;  // by seq
  std::optional<Held> hot;           // the last committed, in `pool`
  pid_t pid = 0;                     // the linked trainer; 0: none
};

pid_t peer_pid(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  return ::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? cred.pid : 0;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Whether process `pid` runs (a zombie, killed and not reaped yet, does not: its sockets are
// closed, so its link ends on its own).
bool alive(pid_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) return false;
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ||
         (stat[paren + 2] != 'Z' && stat[paren + 2] != 'X');
}

// Writes `data` of `len` bytes at `offset` of fd; throws IoError naming `path`.
void write_all(int fd, const uint8_t* data, uint64_t len, uint64_t offset,
               const std::string& path) {
  while (len > 0) {
    const ssize_t n = ::pwrite(fd, data, len, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) detail::throw_sys_error(-errno, "write " + path);
    data += n;
    len -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

}  // namespace

struct TSNAP_HIDDEN Agent::Impl {
  AgentOptions options;
  io::UniqueFd listener;
  std::shared_ptr<io::Engine> engine = io::make_pwrite_engine(1);
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool stopping = false;
  std::map<std::string, RootState> roots;
  std::map<int, std::thread> links;   // by socket
  std::vector<std::thread> finished;  // joined by the next accept or the destructor
  uint64_t commits = 0;
  std::thread acceptor;

  void log(const std::string& line) const {
    if (options.log) {
      options.log(line);
    } else {
      std::cerr << "tsnap agent: " << line << std::endl;
    }
  }
  void accept_loop();
  void serve(int sock);
  // One message of a linked trainer; returns the root it says hello for.
  void handle(int sock, const nlohmann::json& m, io::UniqueFd fd, std::string& root);
  // Commits `held`, handed over by a trainer that died, from `pool` into `root`; returns the
  // manifest's text as committed (the trainer's own when it committed it first).
  std::string commit(const std::string& root, const Pool& pool, const Held& held);
};

Agent::Agent(AgentOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->listener = pipeline::agent::listen_at(impl_->options.socket);
  impl_->acceptor = std::thread([impl = impl_.get()] { impl->accept_loop(); });
}

Agent::~Agent() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    for (auto& [sock, thread] : impl_->links) ::shutdown(sock, SHUT_RDWR);
  }
  ::shutdown(impl_->listener.get(), SHUT_RDWR);
  impl_->acceptor.join();
  std::map<int, std::thread> links;
  std::vector<std::thread> finished;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    links.swap(impl_->links);
    finished.swap(impl_->finished);
  }
  for (auto& [sock, thread] : links) thread.join();
  for (std::thread& t : finished) t.join();
  std::error_code ec;
  fs::remove(impl_->options.socket, ec);
}

const fs::path& Agent::socket() const { return impl_->options.socket; }

size_t Agent::links() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->links.size();
}

uint64_t Agent::commits() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->commits;
}

void Agent::wait_unlinked() const {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->links.empty(); });
}

void Agent::Impl::accept_loop() {
  detail::name_this_thread("tsnap-agent");
  for (;;) {
    const int sock = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
    std::vector<std::thread> done;
    std::lock_guard<std::mutex> lock(mu);
    done.swap(finished);
    for (std::thread& t : done) t.join();  // they ended: joins at once
    if (stopping) {
      if (sock >= 0) ::close(sock);
      return;
    }
    if (sock < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      log("accept failed: " + std::string(std::strerror(errno)));
      return;
    }
    links.emplace(sock, std::thread([this, sock] { serve(sock); }));
  }
}

void Agent::Impl::serve(int sock) {
  detail::name_this_thread("tsnap-agent-link");
  const std::string peer = options.socket.string();
  const pid_t pid = peer_pid(sock);
  std::string root;
  bool peer_closed = false;
  try {
    for (;;) {
      io::UniqueFd fd;
      std::optional<nlohmann::json> m = pipeline::agent::recv_frame(sock, peer, &fd);
      if (!m) {
        peer_closed = true;
        break;
      }
      handle(sock, *m, std::move(fd), root);
    }
  } catch (const IoError& e) {
    // A trainer killed with a reply unread resets the link (ECONNRESET): it is gone all the
    // same, and what it handed over is committed below.
    peer_closed = true;
    if (e.sys_errno() != ECONNRESET) {
      log("link of trainer pid " + std::to_string(pid) + " failed: " + e.what());
    }
  } catch (const std::exception& e) {
    peer_closed = true;  // a broken link: the trainer's saves are as good as abandoned
    log("link of trainer pid " + std::to_string(pid) + " failed: " + e.what());
  }
  std::unique_lock<std::mutex> lock(mu);
  if (!root.empty() && roots[root].pid == pid) {
    RootState& state = roots[root];
    if (peer_closed && !stopping && !state.guarded.empty()) {
      // The trainer is gone: commit what it handed over. The root stays this link's (a new
      // trainer's hello waits) until that is done.
      std::map<uint64_t, Held> guarded = std::move(state.guarded);
      std::shared_ptr<Pool> pool = state.pool;
      lock.unlock();
      std::optional<Held> last;
      uint64_t n = 0;
      for (auto& [seq, held] : guarded) {
        try {
          held.manifest = commit(root, *pool, held);
          last = std::move(held);
          ++n;
        } catch (const std::exception& e) {
          log("could not commit " + root + "/" + held.name + " for trainer pid " +
              std::to_string(pid) + ": " + e.what());
        }
      }
      lock.lock();
      if (last) state.hot = std::move(last);
      commits += n;
    }
    state.guarded.clear();
    state.pid = 0;
  }
  ::close(sock);
  auto it = links.find(sock);
  if (it != links.end()) {
    finished.push_back(std::move(it->second));
    links.erase(it);
  }
  cv.notify_all();
}

void Agent::Impl::handle(int sock, const nlohmann::json& m, io::UniqueFd fd, std::string& root) {
  const std::string peer = options.socket.string();
  const std::string op = m.value("op", "");
  const pid_t pid = peer_pid(sock);
  if (op == "hello") {
    const std::string asked = m.at("root").get<std::string>();
    std::unique_lock<std::mutex> lock(mu);
    RootState& state = roots[asked];
    // A dead trainer's link may still be committing: wait for it; a live one keeps the root.
    while (state.pid != 0 && !stopping) {
      if (alive(state.pid)) {
        lock.unlock();
        pipeline::agent::send_frame(
            sock,
            {{"op", "refused"},
             {"why", "trainer pid " + std::to_string(state.pid) + " is linked for this root"}},
            peer);
        return;
      }
      cv.wait_for(lock, std::chrono::milliseconds(50));
    }
    state.pid = pid;
    root = asked;
    nlohmann::json welcome{{"op", "welcome"}};
    int pool_fd = -1;
    if (state.pool) {
      nlohmann::json p{{"count", state.pool->count}, {"buffer_bytes", state.pool->buffer_bytes}};
      if (state.hot) {
        p["hot"] = {{"name", state.hot->name},
                    {"manifest", state.hot->manifest},
                    {"bufs", state.hot->bufs}};
      }
      welcome["pool"] = std::move(p);
      pool_fd = state.pool->memory->fd();
    }
    lock.unlock();
    pipeline::agent::send_frame(sock, welcome, peer, pool_fd);
    return;
  }
  if (root.empty()) throw_error(ErrorCode::kInvalidArgument, "'" + op + "' before hello");
  if (op == "pool") {
    if (!fd.valid()) throw_error(ErrorCode::kInvalidArgument, "a pool without its memfd");
    auto pool = std::make_shared<Pool>();
    pool->count = m.at("count").get<size_t>();
    pool->buffer_bytes = m.at("buffer_bytes").get<size_t>();
    pool->memory = detail::AnonMemory::shared(pool->count * pool->buffer_bytes, fd.get(),
                                              /*huge=*/false, "a trainer's staging pool");
    std::lock_guard<std::mutex> lock(mu);
    RootState& state = roots[root];
    state.pool = std::move(pool);
    state.hot.reset();  // in the pool it replaces
  } else if (op == "guard") {
    const uint64_t seq = m.at("seq").get<uint64_t>();
    Held held{m.at("name").get<std::string>(), m.at("manifest").get<std::string>(),
              m.at("bufs").get<std::map<std::string, std::vector<int>>>(),
              m.value("overwrite", false)};
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu);
      RootState& state = roots[root];
      if (!state.pool) {
        why = "no staging pool was shared";
      } else {
        for (const auto& [file, bufs] : held.bufs) {
          for (int b : bufs) {
            if (b < 0 || size_t(b) >= state.pool->count) why = "buffer out of range in " + file;
          }
        }
      }
      if (why.empty()) state.guarded[seq] = std::move(held);
    }
    if (!why.empty()) log("refused save " + held.name + " of " + root + ": " + why);
    pipeline::agent::send_frame(sock,
                                why.empty() ? nlohmann::json{{"op", "guarded"}, {"seq", seq}}
                                            : nlohmann::json{{"op", "refused"}, {"why", why}},
                                peer);
  } else if (op == "done") {
    const uint64_t seq = m.at("seq").get<uint64_t>();
    std::lock_guard<std::mutex> lock(mu);
    RootState& state = roots[root];
    auto it = state.guarded.find(seq);
    if (it == state.guarded.end()) return;
    if (m.contains("manifest")) {
      it->second.manifest = m.at("manifest").get<std::string>();
      state.hot = std::move(it->second);
    }
    state.guarded.erase(it);
  } else {
    throw_error(ErrorCode::kInvalidArgument, "unknown message '" + op + "'");
  }
}

std::string Agent::Impl::commit(const std::string& root, const Pool& pool, const Held& held) {
  const std::string final = root + "/" + held.name;
  Manifest m = format::parse_manifest(held.manifest, final);
  {
    // Committed by the trainer just before it died?
    std::error_code ec;
    const fs::path committed = fs::path(final) / kManifestName;
    if (fs::exists(committed, ec)) {
      std::string text = read_text(committed);
      try {
        if (format::parse_manifest(text, final).id == m.id) return text;
      } catch (const Error&) {
      }
      if (!held.overwrite) {
        throw_error(ErrorCode::kAlreadyExists, "snapshot " + final + " exists (another save)");
      }
    }
  }
  // Hashes of the bytes staged, which the trainer had not computed yet when it handed over.
  for (FileRecord& f : m.files) {
    const auto it = held.bufs.find(f.name);
    if (it == held.bufs.end() || it->second.size() != f.chunk_hashes.size()) {
      throw_error(ErrorCode::kBadManifest, "the save's buffers do not cover file " + f.name);
    }
    for (uint64_t c = 0; c < f.chunk_hashes.size(); ++c) {
      f.chunk_hashes[c] = format::hash64(pool.buffer(it->second[c]), format::chunk_length(f, c));
    }
  }
  const std::string text = format::readable_manifest_text(m);
  pipeline::RootLock lock(root);  // a writer of the root: removes the trainer's leftovers
  pipeline::CommitPaths paths{
      root, root + "/" + format::temporary_name(held.name, format::new_save_id()), final};
  try {
    if (::mkdir(paths.temporary.c_str(), 0755) != 0) {
      detail::throw_sys_error(-errno, "create " + paths.temporary);
    }
    for (const FileRecord& f : m.files) {
      const std::string path = paths.temporary + "/" + f.name;
      io::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (!fd.valid()) detail::throw_sys_error(-errno, "create " + path);
      const std::vector<int>& bufs = held.bufs.at(f.name);
      for (uint64_t c = 0; c < f.chunk_hashes.size(); ++c) {
        write_all(fd.get(), pool.buffer(bufs[c]), format::chunk_length(f, c),
                  format::chunk_offset(f, c), path);
      }
      if (::fsync(fd.get()) != 0) detail::throw_sys_error(-errno, "fsync " + path);
      const int rc = fd.close();
      if (rc < 0) detail::throw_sys_error(rc, "close " + path);
    }
    pipeline::commit_directory(*engine, paths, text, held.overwrite);
  } catch (...) {
    pipeline::remove_temporary(paths.temporary);
    throw;
  }
  log("committed " + final + " for a trainer that exited");
  return text;
}

}  // namespace tsnap
