// Object storage as the durable tier (SnapshotterOptions::tier.durable_root = "s3://..."), against
// a real S3-protocol server started by the tests: drain, then restore with the local tier gone; a
// corrupted object found at restore; wrong credentials and a store that is down failing the drain
// but never the training; a drain killed mid-upload resumed by the next process with no partial
// snapshot ever listed; retention in the store; the public calls on s3:// paths.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "format/layout.h"
#include "format/s3_root.h"
#include "support/s3_server.h"
#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/checkpoint.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/periodic_snapshots.h"
#include "tsnap/reader.h"
#include "tsnap/remove.h"
#include "tsnap/save.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::make_tensor;
using test_support::S3Server;
using test_support::TempDir;

// Points the environment (what tsnap reads its S3 configuration from) at the test server.
class S3Tier : public ::testing::Test {
 protected:
  void SetUp() override {
    S3Server& s3 = S3Server::shared();
    if (!s3.available()) GTEST_SKIP() << s3.why();
    config_ = s3.config();
    set_credentials(config_.access_key, config_.secret_key);
    ::setenv("AWS_ENDPOINT_URL_S3", config_.endpoint.c_str(), 1);
    ::setenv("AWS_REGION", config_.region.c_str(), 1);
    ::setenv("TSNAP_S3_PATH_STYLE", "1", 1);
    static std::atomic<int> buckets{0};
    bucket_ = "tsnap-tier-" + std::to_string(::getpid()) + "-" + std::to_string(buckets++);
    io::S3Client(config_).create_bucket(bucket_);
  }
  void set_credentials(const std::string& key, const std::string& secret) {
    ::setenv("AWS_ACCESS_KEY_ID", key.c_str(), 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", secret.c_str(), 1);
  }
  std::string url(const std::string& prefix) const { return "s3://" + bucket_ + "/" + prefix; }
  SnapshotterOptions options(const fs::path& local, const std::string& durable) const {
    SnapshotterOptions o;
    o.root = local;
    o.tier.durable_root = durable;
    o.chunk_bytes = 1 << 20;
    o.staging.budget_bytes = 8 << 20;
    o.tier.local_keep_last = 0;
    return o;
  }

  io::S3Config config_;
  std::string bucket_;
};

// 20 MiB in three tensors: the largest shard is uploaded in parts (8 MiB, whole chunks).
StateDict state_of(uint64_t seed) {
  StateDict sd;
  sd.insert("big", make_tensor(at::kFloat, {4 << 20}, seed));
  sd.insert("mid", make_tensor(at::kFloat, {1 << 20}, seed + 1));
  sd.insert("step", at::scalar_tensor(static_cast<int64_t>(seed), at::kLong));
  return sd;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Checkpoint checkpoint_at(const StateDict& sd, int64_t step) {
  Checkpoint c = Checkpoint::of({{"state", sd}});
  c.metadata()["step"] = step;
  return c;
}

void expect_same(const StateDict& got, const StateDict& want, const std::string& prefix = "") {
  for (const std::string& key : want.keys()) {
    ASSERT_TRUE(got.contains(prefix + key)) << prefix + key;
    EXPECT_TRUE(bitwise_equal(got.at(prefix + key), want.at(key))) << key;
  }
}

TEST_F(S3Tier, DrainedSnapshotsRestoreFromTheStoreWithTheLocalTierGone) {
  const StateDict sd = state_of(3);
  const std::string durable = url("run");
  {
    TempDir local;
    Snapshotter snap(options(local.path(), durable));
    snap.save_async(format::step_name(5), checkpoint_at(sd, 5)).wait();
    snap.drain_wait();
    EXPECT_TRUE(snap.drained(format::step_name(5)));
  }  // the local tier is gone
  const std::vector<Listed> listed = list(durable);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].committed) << listed[0].problem;
  EXPECT_EQ(listed[0].path.string(), durable + "/" + format::step_name(5));
  EXPECT_TRUE(verify(listed[0].path).empty());
  expect_same(load(listed[0].path), sd, "state/");

  // A new process on a new local disk resumes from the store.
  TempDir local2;
  Snapshotter snap(options(local2.path(), durable));
  ASSERT_TRUE(snap.latest().has_value());
  EXPECT_EQ(snap.latest()->string(), durable + "/" + format::step_name(5));
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 100}), [&] { return checkpoint_at(sd, 0); },
                         {.log = nullptr});
  StateDict resumed;
  const int64_t step = hook.resume([&](Checkpoint& c) { resumed = c.state(); });
  EXPECT_EQ(step, 5);
  expect_same(resumed, sd, "state/");
  LoadOptions only_big;
  only_big.include = {"state/big"};
  StateDict dest;
  dest.insert("state/big", at::zeros_like(sd.at("big")));
  load_into(listed[0].path, dest, only_big);
  EXPECT_TRUE(bitwise_equal(dest.at("state/big"), sd.at("big")));
}

// A restore of some keys reads the chunks that hold them, not their whole shards, and no local
// copy is made.
TEST_F(S3Tier, ARestoreOfSomeKeysReadsOnlyTheirChunks) {
  const StateDict sd = state_of(4);
  const std::string durable = url("ranged");
  {
    TempDir local;
    SnapshotterOptions o = options(local.path(), durable);
    o.chunk_bytes = 256 << 10;
    Snapshotter snap(o);
    SaveOptions one_file;
    one_file.num_shards = 1;
    snap.save_async("s", sd, nlohmann::json::object(), one_file).wait();
    snap.drain_wait();
  }
  const Manifest m = read_manifest(durable + "/s");
  ASSERT_EQ(m.files.size(), 1u);
  const FileRecord& f = m.files[0];
  const TensorRecord* mid = m.find("mid");
  ASSERT_NE(mid, nullptr);
  TempDir fetch_dir;  // a local copy, if one were made, would land here
  ::setenv("TSNAP_FETCH_DIR", fetch_dir.path().c_str(), 1);
  LoadOptions only_mid;
  only_mid.include = {"mid"};
  StateDict dest;
  dest.insert("mid", at::zeros_like(sd.at("mid")));
  const LoadReport report = load_into(durable + "/s", dest, only_mid);
  ::unsetenv("TSNAP_FETCH_DIR");
  EXPECT_TRUE(bitwise_equal(dest.at("mid"), sd.at("mid")));
  EXPECT_GE(report.bytes_read, mid->nbytes());
  EXPECT_LE(report.bytes_read, mid->nbytes() + 2 * f.chunk_bytes);
  EXPECT_LT(report.bytes_read, f.size / 2) << "read most of the shard for a fifth of it";
  EXPECT_TRUE(std::filesystem::is_empty(fetch_dir.path()));
  expect_same(load(durable + "/s"), sd);
}

TEST_F(S3Tier, ACorruptedObjectIsFoundAtRestoreNamingItsChunk) {
  TempDir local;
  const std::string durable = url("corrupt");
  {
    Snapshotter snap(options(local.path(), durable));
    SaveOptions two_files;
    two_files.num_shards = 2;
    snap.save_async("s", state_of(1), nlohmann::json::object(), two_files).wait();
    snap.drain_wait();
  }
  const Manifest m = read_manifest(durable + "/s");
  ASSERT_EQ(m.files.size(), 2u);
  const FileRecord& f = m.files.front();
  io::S3Client client(config_);
  const std::string key = "corrupt/s/" + f.name;
  std::string bytes = client.get_object(bucket_, *client.head_object(bucket_, key));
  bytes[f.size - 1] ^= 0x40;  // the last chunk
  client.put_object(bucket_, key, bytes.data(), bytes.size());
  try {
    (void)load(durable + "/s");
    ADD_FAILURE() << "a corrupted object loaded";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kHashMismatch);
    EXPECT_NE(std::string(e.what()).find(durable + "/s/" + f.name), std::string::npos) << e.what();
  }
  // A load of keys that all live in the other file GETs that file only, and succeeds.
  LoadOptions elsewhere;
  for (const TensorRecord& t : m.tensors) {
    if (t.file != f.name) elsewhere.include.push_back(t.name);
  }
  ASSERT_FALSE(elsewhere.include.empty());
  const StateDict part = load(durable + "/s", elsewhere);
  EXPECT_EQ(part.size(), elsewhere.include.size());
  const std::vector<BadChunk> bad = verify(durable + "/s");
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].file, f.name);
  EXPECT_EQ(bad[0].chunk, f.chunk_hashes.size() - 1);
  // A missing object is reported too.
  client.delete_object(bucket_, key);
  EXPECT_FALSE(verify(durable + "/s").empty());
}

// A manifest that claims a shard of 3 GiB in 1 GiB chunks for an object of a few KiB: verify
// and load say the object is truncated, naming it, before allocating for the claim.
TEST_F(S3Tier, AManifestClaimingMoreThanItsObjectsHoldFailsBeforeAllocating) {
  TempDir local;
  save(local / "s", state_of(5));
  nlohmann::json m = nlohmann::json::parse(slurp(local / "s" / kManifestName));
  const std::string file = m["tensors"]["mid"]["file"];
  nlohmann::json& f = m["files"][file];
  const uint64_t claimed = 3ull << 30;
  f["size"] = claimed;
  f["chunk_bytes"] = 1ull << 30;
  f["chunk_hashes"] = {"0000000000000000", "0000000000000000", "0000000000000000"};
  io::S3Client client(config_);
  for (const fs::directory_entry& e : fs::directory_iterator(local / "s")) {
    const std::string bytes = e.path().filename() == kManifestName
                                  ? test_support::signed_manifest_text(m)
                                  : slurp(e.path());
    client.put_object(bucket_, "claims/s/" + e.path().filename().string(), bytes.data(),
                      bytes.size());
  }
  const std::string object = url("claims") + "/s/" + file;
  const std::vector<BadChunk> bad = verify(url("claims") + "/s");
  ASSERT_EQ(bad.size(), 3u);
  for (const BadChunk& b : bad) EXPECT_EQ(b.problem, "truncated") << b.file << " " << b.chunk;
  try {
    (void)load(url("claims") + "/s");
    ADD_FAILURE() << "loaded";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTruncated) << e.what();
    EXPECT_NE(std::string(e.what()).find(object + " is "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the manifest says " + std::to_string(claimed)),
              std::string::npos)
        << e.what();
  }
}

// Two Snapshotters drain the same snapshot name into one prefix at once: the manifest is
// published with If-None-Match, so one of them publishes and the other's drain_wait() says
// that another writer published the snapshot, instead of both succeeding.
TEST_F(S3Tier, TwoWritersOfOneNameTheSecondIsTold) {
  TempDir local_a, local_b;
  const std::string durable = url("race");
  SnapshotterOptions oa = options(local_a.path(), durable);
  SnapshotterOptions ob = options(local_b.path(), durable);
  oa.tier.bytes_per_second = ob.tier.bytes_per_second = 8 << 20;  // each drain takes ~2.5 s
  Snapshotter a(oa), b(ob);
  a.save_async("s", state_of(7)).wait();
  b.save_async("s", state_of(8)).wait();
  int ok = 0;
  std::string told;
  for (Snapshotter* snap : {&a, &b}) {
    try {
      snap->drain_wait();
      ++ok;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists) << e.what();
      told = e.what();
    }
  }
  EXPECT_EQ(ok, 1);
  EXPECT_NE(told.find("another writer published snapshot " + durable + "/s"), std::string::npos)
      << told;
  EXPECT_EQ(list(durable).size(), 1u);
}

TEST_F(S3Tier, RefusedCredentialsFailTheDrainNotTheTrainingAndLoseNothing) {
  if (!S3Server::shared().checks_credentials()) GTEST_SKIP() << S3Server::kCredentialsUnchecked;
  TempDir local;
  const std::string durable = url("creds");
  const StateDict sd = state_of(2);
  set_credentials(config_.access_key, "not-the-secret");
  {
    Snapshotter snap(options(local.path(), durable));  // the store is not asked here
    SaveHandle h = snap.save_async("s", sd);
    h.wait();  // committed locally
    try {
      snap.drain_wait();
      ADD_FAILURE() << "the drain succeeded with a wrong secret";
    } catch (const IoError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("credentials"), std::string::npos) << what;
      EXPECT_EQ(what.find("not-the-secret"), std::string::npos) << what;
    }
    EXPECT_FALSE(snap.drained("s"));
  }
  EXPECT_TRUE(fs::exists(local / "s" / kManifestName));  // never removed while undrained
  set_credentials(config_.access_key, config_.secret_key);
  Snapshotter snap(options(local.path(), durable));  // the next process drains it
  snap.drain_wait();
  EXPECT_TRUE(snap.drained("s"));
  expect_same(load(durable + "/s"), sd);
}

// A TCP proxy on 127.0.0.1 in front of the test server that can be taken down (the listener
// closed, open connections cut) and brought back on the same port: the store stopping and
// restarting, as the client sees it, without losing what the store holds.
class Proxy {
 public:
  explicit Proxy(int target) : target_(target) { up(); }
  ~Proxy() {
    down();
    for (std::thread& t : pumps_) t.join();
  }
  int port() const { return port_; }
  void up() {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a = address(port_);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) std::abort();
    socklen_t len = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(listener_, 64);
    running_ = true;
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  void down() {
    if (!running_) return;
    running_ = false;
    ::shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    ::close(listener_);
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
  }

 private:
  static sockaddr_in address(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return a;
  }
  void accept_loop() {
    for (;;) {
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) return;  // shut down
      const int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a = address(target_);
      if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      open_.insert(client);
      open_.insert(server);
      pumps_.emplace_back([this, client, server] { pump(client, server); });
    }
  }
  void pump(int a, int b) {
    char buf[1 << 16];
    pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    for (bool open = true; open;) {
      if (::poll(fds, 2, 1000) < 0) break;
      for (int i = 0; i < 2 && open; ++i) {
        if (fds[i].revents == 0) continue;
        const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        open = n > 0 && ::write(fds[1 - i].fd, buf, static_cast<size_t>(n)) == n;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    open_.erase(a);
    open_.erase(b);
    ::close(a);
    ::close(b);
  }

  const int target_;
  int port_ = 0;
  int listener_ = -1;
  std::atomic<bool> running_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::set<int> open_;
  std::vector<std::thread> pumps_;
};

// The store stops in the middle of a drain and comes back: the drain fails (drain_wait throws),
// training is not held up, and the next pass of the same Snapshotter resumes the upload.
TEST_F(S3Tier, TheStoreStoppingMidDrainAndRestartingLosesNothing) {
  const int target = std::stoi(config_.endpoint.substr(config_.endpoint.rfind(':') + 1));
  Proxy proxy(target);
  ::setenv("AWS_ENDPOINT_URL_S3", ("http://127.0.0.1:" + std::to_string(proxy.port())).c_str(), 1);
  TempDir local;
  const std::string durable = url("restart");
  StateDict sd;
  sd.insert("big", make_tensor(at::kFloat, {10 << 20}, 11));  // 40 MiB: 5 parts of 8 MiB
  SnapshotterOptions o = options(local.path(), durable);
  o.tier.bytes_per_second = 8 << 20;
  Snapshotter snap(o);
  uint64_t resumed = 0;
  snap.add_drain_listener([&](const DrainRecord& r) { resumed += r.resumed_bytes; });
  snap.save_async("s", sd).wait();
  io::S3Client direct(config_);
  bool parts_seen = false;
  for (int i = 0; i < 600 && !parts_seen; ++i) {
    for (const io::S3Upload& u : direct.list_multipart_uploads(bucket_, "restart/")) {
      if (!direct.list_parts(bucket_, u.key, u.upload_id).empty()) parts_seen = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(parts_seen);
  proxy.down();  // the store stops
  const auto t0 = std::chrono::steady_clock::now();
  SaveHandle during = snap.save_async("t", sd);  // training goes on meanwhile
  during.wait();
  EXPECT_LT(during.stats().stall_s, 5.0);
  EXPECT_THROW(snap.drain_wait(), IoError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  proxy.up();  // and comes back on the same port
  snap.drain_wait();
  EXPECT_TRUE(snap.drained("s"));
  EXPECT_TRUE(snap.drained("t"));
  EXPECT_GE(resumed, 8u << 20);
  expect_same(load(durable + "/s"), sd);
}

TEST_F(S3Tier, AStoreThatIsDownFailsTheDrainQuicklyAndTheNextDrainCompletes) {
  TempDir local;
  const std::string durable = url("down");
  // A port nothing listens on: the store is down.
  ::setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9", 1);
  {
    Snapshotter snap(options(local.path(), durable));
    const auto t0 = std::chrono::steady_clock::now();
    snap.save_async("s", state_of(4)).wait();
    EXPECT_THROW(snap.drain_wait(), IoError);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  }
  {
    // While it is down, the local tier alone answers latest() and resume (a snapshot with a
    // step, as the hook saves them).
    Snapshotter snap(options(local.path(), durable));
    snap.save_async(format::step_name(7), checkpoint_at(state_of(4), 7)).wait();
    ASSERT_TRUE(snap.latest().has_value());
    EXPECT_EQ(snap.latest()->filename().string(), format::step_name(7));
    PeriodicSnapshots hook(snap, Schedule({.every_steps = 100}),
                           [&] { return checkpoint_at(state_of(4), 0); }, {.log = nullptr});
    EXPECT_EQ(hook.resume([](Checkpoint&) {}), 7);
  }
  ::setenv("AWS_ENDPOINT_URL_S3", config_.endpoint.c_str(), 1);  // back up
  Snapshotter snap(options(local.path(), durable));
  snap.drain_wait();
  expect_same(load(durable + "/s"), state_of(4));
}

// A drain killed mid-upload: no snapshot is listed as committed meanwhile, and the next
// process resumes the multipart upload (keeping the parts already there) and completes it.
TEST_F(S3Tier, ADrainKilledMidUploadIsResumedAndNeverListedHalfDone) {
  TempDir local;
  const std::string durable = url("killed");
  StateDict sd;
  sd.insert("big", make_tensor(at::kFloat, {10 << 20}, 9));  // 40 MiB: 5 parts of 8 MiB
  {
    SnapshotterOptions o = options(local.path(), "");
    Snapshotter snap(o);
    snap.save_async("s", sd).wait();  // committed locally, not drained yet
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = 0;
    try {  // nothing may escape into the test framework's copy in this process
      SnapshotterOptions o = options(local.path(), durable);
      o.tier.bytes_per_second = 8 << 20;  // 5 s for the whole file
      Snapshotter snap(o);
      snap.drain_wait();
    } catch (...) {
      status = 1;
    }
    ::_exit(status);
  }
  // Killed and reaped however this test ends.
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      if (pid <= 0) return;
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
  } reaper{child};
  io::S3Client client(config_);
  bool parts_seen = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!parts_seen && std::chrono::steady_clock::now() < deadline) {
    for (const io::S3Upload& u : client.list_multipart_uploads(bucket_, "killed/")) {
      if (!client.list_parts(bucket_, u.key, u.upload_id).empty()) parts_seen = true;
    }
    for (const Listed& l : list(durable)) EXPECT_FALSE(l.committed) << l.name;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  reaper.pid = 0;
  ASSERT_TRUE(parts_seen) << "the child uploaded no part within 60 s";
  for (const Listed& l : list(durable)) EXPECT_FALSE(l.committed) << l.name;

  Snapshotter snap(options(local.path(), durable));
  uint64_t resumed = 0;
  snap.add_drain_listener([&](const DrainRecord& r) { resumed += r.resumed_bytes; });
  snap.drain_wait();
  EXPECT_TRUE(snap.drained("s"));
  EXPECT_GE(resumed, 8u << 20);  // at least the part seen
  EXPECT_TRUE(client.list_multipart_uploads(bucket_, "killed/").empty());
  expect_same(load(durable + "/s"), sd);
}

TEST_F(S3Tier, KeepRulesApplyInTheStore) {
  TempDir local;
  const std::string durable = url("retention");
  Snapshotter snap(options(local.path(), durable));
  StateDict sd;
  sd.insert("w", make_tensor(at::kFloat, {1024}, 1));
  PeriodicSnapshots hook(snap, Schedule({.every_steps = 1, .keep_last = 2}),
                         [&] {
                           return Checkpoint::of({{"m", sd}});
                         },
                         {.when_busy = WhenBusy::kWait, .log = nullptr});
  for (int64_t step = 1; step <= 4; ++step) {
    sd.at("w").add_(1);
    hook.after_step(step);
  }
  hook.finish();
  snap.drain_wait();
  std::vector<std::string> names;
  for (const Listed& l : list(durable)) {
    if (l.committed) names.push_back(l.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{format::step_name(3), format::step_name(4)}));
  // remove_snapshot on the store: the manifest first, then the rest.
  remove_snapshot(durable + "/" + format::step_name(3));
  EXPECT_EQ(list(durable).size(), 1u);
  EXPECT_THROW(remove_snapshot(durable + "/" + format::step_name(3)), IoError);
}

#ifdef TSNAP_CLI_PATH  // a build with the tool (tests/CMakeLists.txt)
// What `tsnap <args>` printed (stdout and stderr) and its exit status.
std::pair<int, std::string> run_tool(const std::string& args) {
  std::string out;
  FILE* p = ::popen((std::string(TSNAP_CLI_PATH) + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST_F(S3Tier, TheToolAndTheLazyReaderTakeStoreUrls) {
  TempDir local;
  const std::string durable = url("tool");
  const StateDict sd = state_of(6);
  {
    Snapshotter snap(options(local.path(), durable));
    snap.save_async("s", sd).wait();
    snap.drain_wait();
  }
  auto [ls_status, ls] = run_tool("ls " + durable);
  EXPECT_EQ(ls_status, 0) << ls;
  EXPECT_NE(ls.find("s"), std::string::npos) << ls;
  auto [inspect_status, inspect] = run_tool("inspect " + durable + "/s");
  EXPECT_EQ(inspect_status, 0) << inspect;
  EXPECT_NE(inspect.find("big"), std::string::npos) << inspect;
  auto [verify_status, verified] = run_tool("verify " + durable + "/s");
  EXPECT_EQ(verify_status, 0) << verified;
  const SnapshotReader reader = open(durable + "/s");
  EXPECT_TRUE(bitwise_equal(reader.read("mid"), sd.at("mid")));
  EXPECT_TRUE(bitwise_equal(reader.read("big"), sd.at("big")));
}
#endif

}  // namespace
}  // namespace tsnap
