#include "bench/restore.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "bench/raw_io.h"
#include "bench/session.h"
#include "tsnap/error.h"
#include "tsnap/hot_snapshot.h"
#include "tsnap/load.h"
#include "tsnap/save.h"
#include "tsnap/snapshotter.h"

namespace fs = std::filesystem;

namespace tsnap::bench {

const RestoreResult::RawRead& RestoreResult::best_raw() const {
  return *std::min_element(
      raw_direct.begin(), raw_direct.end(),
      [](const RawRead& a, const RawRead& b) { return a.s.median() < b.s.median(); });
}

RestoreResult run_restore(const RestoreSpec& spec, StateDict& state, const fs::path& work,
                          Progress& progress) {
  const fs::path snap = work / "snap";
  const std::string torch_file = (work / "state.pt").string();
  const std::string raw_file = (work / "raw.bin").string();
  RestoreResult r;
  progress.show("saving the snapshot...");
  std::unique_ptr<Snapshotter> keeper;  // holds the hot snapshot while it lives
  HotSnapshot hot;
  if (spec.hot) {
    // One save: a budget of one snapshot (its chunks, and a partial one per shard) is enough.
    keeper = std::make_unique<Snapshotter>(SnapshotterOptions{
        .root = work,
        .chunk_bytes = spec.chunk,
        .staging = {.budget_bytes = (state.nbytes() / spec.chunk + 8) * spec.chunk,
                    .keep_hot = true}});
    keeper->save_async(snap.filename().string(), state).wait();
    hot = keeper->hot_snapshot();
    if (!hot) throw_error(ErrorCode::kInternal, "the benchmark's save kept no hot snapshot");
  } else {
    tsnap::save(snap, state, {}, {.chunk_bytes = spec.chunk});
  }
  const Manifest manifest = tsnap::read_manifest(snap);
  r.bytes = manifest.total_bytes();
  r.shards = manifest.files.size();
  std::vector<std::string> shards;
  for (const FileRecord& f : manifest.files) shards.push_back((snap / f.name).string());
  if (spec.torch) torch_save_fsync(state, torch_file, true);
  // Cold: every file of the benchmark out of the page cache (the others' files stay).
  auto evict = [&] {
    for (const std::string& f : files_under(work)) evict_from_cache(f);
  };

  evict();
  const LoadOptions opts{.read_budget_bytes = spec.read_budget};
  r.engine = tsnap::load_into(snap, state, opts).engine;
  // The raw baseline reads through an engine of the same kind a file of as many bytes as the
  // snapshot's shards (not zeros), at each read size and depth of the sweep.
  std::vector<std::unique_ptr<RawIo>> raws;
  for (const uint64_t block : {4ull << 20, 16ull << 20}) {
    for (const unsigned depth : {16u, 32u}) {
      r.raw_direct.push_back({block, depth, {}});
      raws.push_back(
          std::make_unique<RawIo>(RawIoOptions{.uring = r.engine.rfind("io_uring", 0) == 0,
                                               .depth = depth,
                                               .chunk = block,
                                               .buffers = depth,
                                               .register_buffers = true}));
    }
  }
  raws.front()->write(raw_file, r.bytes, /*direct=*/true, /*keep=*/true);

  LoadOptions no_verify = opts;
  no_verify.verify = false;
  auto into = [&](Series& s, std::string* engine_used) {
    const long base = status_kib("VmRSS:");
    const bool reset = reset_peak_rss();
    const LoadReport report = tsnap::load_into(snap, state, opts);
    s.add(report.seconds);
    *engine_used = report.engine;
    if (reset) r.peak_extra_kib = std::max(r.peak_extra_kib, status_kib("VmHWM:") - base);
  };
  auto load_new = [&](Series& s) {
    const auto t0 = Clock::now();
    const StateDict fresh = tsnap::load(snap, opts);
    s.add(since(t0));
  };
  for (int rep = 0; rep < spec.reps; ++rep) {
    const std::string at = "rep " + std::to_string(rep + 1) + "/" + std::to_string(spec.reps);
    progress.show(at + ": cold");
    for (size_t i = 0; i < raws.size(); ++i) {
      evict();
      r.raw_direct[i].s.add(raws[i]->read(raw_file, /*direct=*/true));
    }
    evict();
    r.raw_buffered.add(buffered_read(raw_file));
    evict();
    into(r.cold_into, &r.cold_engine);
    evict();
    load_new(r.cold_load);
    if (spec.torch) {
      evict();
      r.cold_torch.add(torch_load(torch_file));
    }
    progress.show(at + ": warm");
    for (const std::string& s : shards) buffered_read(s);
    buffered_read(raw_file);
    r.warm_raw.add(buffered_read(raw_file));
    into(r.warm_into, &r.warm_engine);
    r.warm_into_noverify.add(tsnap::load_into(snap, state, no_verify).seconds);
    load_new(r.warm_load);
    if (spec.torch) {
      buffered_read(torch_file);
      r.warm_torch.add(torch_load(torch_file));
    }
    if (spec.hot) {
      progress.show(at + ": hot");
      r.hot_into.add(tsnap::load_into(hot, state, opts).seconds);
      const auto t0 = Clock::now();
      const StateDict fresh = tsnap::load(hot, opts);
      r.hot_load.add(since(t0));
    }
  }
  return r;
}

}  // namespace tsnap::bench
