// Object storage as the durable tier, against the raw S3 operations on the same bytes, in one
// run against one store (the S3 configuration of the environment: scripts/s3-server.sh start
// prints one for a local server):
//   drain     a committed local snapshot copied to s3://BUCKET/PREFIX (drain_wait after a
//             save's local commit: the DrainRecord's seconds) against a raw parallel multipart
//             upload of the same bytes (parts of 16 MiB, the drain's thread count and twice it;
//             the faster counts);
//   restore   tsnap::load of the drained snapshot (verified ranged GETs into a local copy, then
//             the local load) against raw parallel ranged GETs of the same bytes into memory
//             (16 MiB ranges, 8 threads, as the fetch);
//   boto3     the same shard files uploaded by boto3's transfer manager as `aws s3 cp
//             --recursive` does (16 MiB parts, 4 in flight; bench/boto3_upload.py run by the
//             Python of --boto3-python, the test server's environment by default);
//   stall     save_async's stall alone, and while the previous snapshot drains.
// Medians of --reps. Usage:
//   eval "$(scripts/s3-server.sh start)"
//   build/bench/tsnap_bench_s3 --bucket tsnap-bench --local /tmp/bench/s3-local [--mib 512]

#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/run_parallel.h"
#include "format/s3_root.h"
#include "io/s3_client.h"
#include "pipeline/s3_store.h"
#include "restore/s3_fetch.h"
#include "tsnap/load.h"
#include "tsnap/remove.h"
#include "tsnap/snapshotter.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

constexpr uint64_t kPart = 16ull << 20;

// A multipart upload of `bytes` from `data` as `key` with `threads` parts in flight.
double raw_upload(tsnap::io::S3Client& c, const std::string& bucket, const std::string& key,
                  const uint8_t* data, uint64_t bytes, int threads) {
  const auto t0 = Clock::now();
  const std::string id = c.create_multipart_upload(bucket, key);
  const size_t parts = (bytes + kPart - 1) / kPart;
  std::vector<tsnap::io::S3Part> done(parts);
  tsnap::detail::run_parallel(parts, threads, [&](size_t p, int) {
    const uint64_t len = std::min(kPart, bytes - p * kPart);
    done[p] = c.upload_part(bucket, key, id, static_cast<int>(p + 1), data + p * kPart, len);
  });
  c.complete_multipart_upload(bucket, key, id, done);
  return since(t0);
}

// Ranged GETs of `bytes` of `key` into memory, `threads` at once.
double raw_download(tsnap::io::S3Client& c, const std::string& bucket, const std::string& key,
                    uint8_t* out, uint64_t bytes, int threads) {
  const auto t0 = Clock::now();
  const size_t parts = (bytes + kPart - 1) / kPart;
  tsnap::detail::run_parallel(parts, threads, [&](size_t p, int) {
    c.get_range(bucket, key, p * kPart, out + p * kPart, std::min(kPart, bytes - p * kPart));
  });
  return since(t0);
}

// Seconds bench/boto3_upload.py took to upload the shard files of snapshot directory `dir`.
double boto3_upload(const std::string& python, const std::string& bucket, const std::string& prefix,
                    const fs::path& dir) {
  std::string command =
      python + " " TSNAP_SOURCE_DIR "/bench/boto3_upload.py " + bucket + " " + prefix;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() != "MANIFEST.json") command += " " + e.path().string();
  }
  FILE* p = ::popen(command.c_str(), "r");
  double seconds = 0;
  if (p == nullptr || std::fscanf(p, "%lf", &seconds) != 1) seconds = 0;
  if (p != nullptr && ::pclose(p) != 0) seconds = 0;
  if (seconds <= 0) {
    std::fprintf(stderr, "boto3 upload failed: %s\n", command.c_str());
    std::exit(1);
  }
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Object storage as the durable tier against raw S3 transfers of the same bytes"};
  std::string bucket = "tsnap-bench", prefix = "bench", local = "/tmp/bench/s3-local";
  int mib = 512, reps = 3;
  app.add_option("--bucket", bucket, "Bucket (created if missing)");
  app.add_option("--prefix", prefix, "Key prefix of the durable root");
  app.add_option("--local", local, "The local tier's directory");
  app.add_option("--mib", mib, "State size in MiB (8 fp32 tensors)")->check(CLI::Range(16, 65536));
  app.add_option("--reps", reps, "Repetitions")->check(CLI::Range(1, 100));
  std::string boto3_python = TSNAP_SOURCE_DIR "/.venv-s3/bin/python";
  app.add_option("--boto3-python", boto3_python, "A Python with boto3 (empty: no boto3 row)");
  CLI11_PARSE(app, argc, argv);

  auto client = tsnap::format::s3_client();
  client->create_bucket(bucket);
  const std::string durable = "s3://" + bucket + "/" + prefix;
  tsnap::StateDict state;
  const int64_t per = static_cast<int64_t>(mib) * (1 << 20) / 4 / 8;
  for (int i = 0; i < 8; ++i) state.insert("t" + std::to_string(i), at::rand({per}));
  const uint64_t bytes = static_cast<uint64_t>(per) * 4 * 8;
  std::vector<uint8_t> raw(bytes);
  for (uint64_t i = 0; i < bytes; i += 4096) raw[i] = static_cast<uint8_t>(i >> 12);

  std::vector<double> drain_s, raw_up, raw_up2, boto3_up, load_s, raw_down, stall_alone,
      stall_draining;
  std::printf("endpoint %s, %s, %.0f MiB per snapshot, %d reps\n",
              client->config().endpoint.c_str(), durable.c_str(), bytes / 1048576.0, reps);
  {
    tsnap::SnapshotterOptions o;
    o.root = local;
    o.tier.durable_root = durable;
    o.tier.local_keep_last = 0;
    tsnap::Snapshotter snap(o);
    double last_drain = 0;
    snap.add_drain_listener([&](const tsnap::DrainRecord& r) {
      if (r.ok) last_drain = r.seconds;
    });
    snap.prepare(state);
    for (int rep = 0; rep < reps; ++rep) {
      const std::string name = "r" + std::to_string(rep);
      tsnap::SaveHandle h = snap.save_async(name, state);
      stall_alone.push_back(h.stats().stall_s);
      h.wait();
      snap.drain_wait();
      drain_s.push_back(last_drain);
      // A save while the previous snapshot drains.
      tsnap::SaveHandle first = snap.save_async(name + "-a", state);
      first.wait();
      tsnap::SaveHandle during = snap.save_async(name + "-b", state);
      stall_draining.push_back(during.stats().stall_s);
      during.wait();
      snap.drain_wait();
      if (!boto3_python.empty()) {
        boto3_up.push_back(
            boto3_upload(boto3_python, bucket, prefix + "-boto3", fs::path(local) / name));
      }
      const auto t0 = Clock::now();
      (void)tsnap::load(durable + "/" + name);
      load_s.push_back(since(t0));
      raw_up.push_back(raw_upload(*client, bucket, prefix + "-raw/obj", raw.data(), bytes,
                                  tsnap::pipeline::kUploadThreads));
      raw_up2.push_back(raw_upload(*client, bucket, prefix + "-raw/obj", raw.data(), bytes,
                                   2 * tsnap::pipeline::kUploadThreads));
      raw_down.push_back(raw_download(*client, bucket, prefix + "-raw/obj", raw.data(), bytes,
                                      tsnap::restore::kFetchThreads));
      for (const char* s : {"", "-a", "-b"}) {
        tsnap::remove_snapshot(durable + "/" + name + s);
        tsnap::remove_tree(fs::path(local) / (name + s));
      }
    }
  }
  client->delete_object(bucket, prefix + "-raw/obj");
  const double gb = bytes / 1e9;
  const double up = std::min(median(raw_up), median(raw_up2));
  std::printf("| measure | median s | GB/s |\n|---|---:|---:|\n");
  std::printf("| tsnap drain (local commit -> committed in the store) | %.3f | %.2f |\n",
              median(drain_s), gb / median(drain_s));
  std::printf("| raw multipart upload, %d parts in flight | %.3f | %.2f |\n",
              tsnap::pipeline::kUploadThreads, median(raw_up), gb / median(raw_up));
  std::printf("| raw multipart upload, %d parts in flight | %.3f | %.2f |\n",
              2 * tsnap::pipeline::kUploadThreads, median(raw_up2), gb / median(raw_up2));
  if (!boto3_up.empty()) {
    std::printf("| boto3 transfer manager (aws s3 cp: 16 MiB parts, 4 in flight) | %.3f | %.2f |\n",
                median(boto3_up), gb / median(boto3_up));
  }
  std::printf("| tsnap::load from the store | %.3f | %.2f |\n", median(load_s),
              gb / median(load_s));
  std::printf("| raw ranged GETs, %d in flight | %.3f | %.2f |\n", tsnap::restore::kFetchThreads,
              median(raw_down), gb / median(raw_down));
  std::printf("| save_async stall, nothing draining | %.3f | |\n", median(stall_alone));
  std::printf("| save_async stall, the previous snapshot draining | %.3f | |\n",
              median(stall_draining));
  std::printf("drain / best raw upload: %.2f (target >= 0.9)\n", up / median(drain_s));
  if (!boto3_up.empty()) {
    std::printf("drain / boto3: %.2f (target >= 1.0)\n", median(boto3_up) / median(drain_s));
  }
  std::printf("load / raw ranged GETs: %.2f (target >= 0.9)\n", median(raw_down) / median(load_s));
  std::printf("stall while draining / alone: %.2f\n", median(stall_draining) / median(stall_alone));
  return 0;
}
