#include "bench/runner.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "bench/raw_io.h"
#include "bench/session.h"
#include "bench/workloads.h"
#include "common/remove_tree.h"
#include "tsnap/load.h"

namespace fs = std::filesystem;

namespace tsnap::bench {

const Measure& PointResult::get(const std::string& key) const {
  for (const Measure& x : m) {
    if (x.key == key) return x;
  }
  throw std::logic_error("no measure " + key);
}

Measure& PointResult::get(const std::string& key) {
  return const_cast<Measure&>(static_cast<const PointResult&>(*this).get(key));
}

const Measure* PointResult::find(const std::string& key) const {
  for (const Measure& x : m) {
    if (x.key == key && !x.s.empty()) return &x;
  }
  return nullptr;
}

std::string dtype_suffix(std::optional<at::ScalarType> dtype) {
  if (!dtype) return "f32";
  return *dtype == at::kBFloat16 ? "bf16" : *dtype == at::kHalf ? "f16" : "f32";
}

SaveRunner::SaveRunner(const StateDict& state, Progress& progress)
    : state_(state), progress_(progress) {}

namespace {

// The measures of a point, in the order of the tables: raw, then each dtype's, then torch.
std::vector<Measure> measures(const PointSpec& spec, const StateDict& state, bool direct) {
  const double in_bytes = output_bytes(state, std::nullopt);
  std::vector<Measure> m = {
      {"raw_write", "raw write + fsync", {}, in_bytes},
      {"raw_read", direct ? "raw read (O_DIRECT)" : "raw read (page cache)", {}, in_bytes}};
  for (size_t i = 0; i < spec.dtypes.size(); ++i) {
    const double out_bytes = output_bytes(state, spec.dtypes[i]);
    const std::string key = i == 0 ? "" : "_" + dtype_suffix(spec.dtypes[i]);
    const std::string label = i == 0 ? "" : " [" + dtype_suffix(spec.dtypes[i]) + "]";
    m.insert(m.end(),
             {{"tsnap_save" + key, "tsnap save (durable; later saves)" + label, {}, 0},
              {"tsnap_stall" + key, "tsnap stall (later saves)" + label, {}, out_bytes},
              {"tsnap_stage" + key, "  of which staging" + label, {}, out_bytes},
              {"tsnap_staged" + key, "tsnap call to staged (lazy)" + label, {}, out_bytes},
              {"memcpy" + key, "memcpy 2 threads (stall floor)" + label, {}, out_bytes},
              {"convert" + key, "convert 2 threads (stall floor)" + label, {}, out_bytes},
              {"tsnap_load" + key, "tsnap::load (cold: files evicted)" + label, {}, 0},
              {"tsnap_load_warm" + key, "tsnap::load (warm: files cached)" + label, {}, 0},
              {"tsnap_verify" + key, "tsnap::verify (cold: files evicted)" + label, {}, 0}});
  }
  m.insert(m.end(), {{"construct", "Snapshotter construction (pool made)", {}, 0},
                     {"first_stall", "first save's stall (the pool's first use)", {}, 0},
                     {"first_touch", "  memset 1 thread, huge pages (former)", {}, 0},
                     {"torch_save", "torch::save + fsync", {}, in_bytes},
                     {"torch_load", "torch::load (cold: file evicted)", {}, in_bytes},
                     {"torch_load_warm", "torch::load (warm: file cached)", {}, in_bytes}});
  return m;
}

}  // namespace

PointResult SaveRunner::run(const PointSpec& spec, size_t index) {
  const SnapshotterOptions& so = spec.snapshotter;
  const fs::path& work = so.root;
  PointResult r;
  r.value = spec.value;
  // The pool is made (and faulted in) here: that cost against the former memset's, measured
  // after it (so that it, not the pool, gets memory that was just freed, which is faster).
  const auto t_make = Clock::now();
  Snapshotter snap(so);
  const double make_s = since(t_make);
  // The first save at once: what it pays of faulting in the pool, whose background thread has
  // just started (stage/staging_pool.h), against the later saves' stall.
  double first_stall = 0;
  {
    SaveOptions save;
    save.dtype = spec.dtypes.front();
    SaveHandle h =
        snap.save_async("first-" + std::to_string(index), state_, nlohmann::json::object(), save);
    h.wait();
    first_stall = h.stats().stall_s;
    detail::remove_tree(h.path().string());
  }
  const double pool_baseline = memset_first_touch(so.staging.budget_bytes);
  r.rss_after_pool_kib = rss_kib();
  r.engine = snap.engine_name();
  const bool direct = r.engine.find("O_DIRECT") != std::string::npos;
  // Only `depth` transfers are ever in flight: more buffers would only cost memory.
  RawIo raw(
      {.uring = r.engine.rfind("io_uring", 0) == 0,
       .depth = so.io.queue_depth,
       .chunk = so.chunk_bytes,
       .buffers = static_cast<size_t>(std::max<uint64_t>(
           2, std::min<uint64_t>(so.io.queue_depth, so.staging.budget_bytes / so.chunk_bytes)))});
  r.m = measures(spec, state_, direct);
  r.get("construct").s.add(make_s);
  r.get("construct").bytes = static_cast<double>(so.staging.budget_bytes);
  r.get("first_stall").s.add(first_stall);
  r.get("first_touch").s.add(pool_baseline);
  r.get("first_touch").bytes = static_cast<double>(so.staging.budget_bytes);
  const uint64_t in_bytes = output_bytes(state_, std::nullopt);
  uint64_t floor_bytes = 0;
  for (const auto& d : spec.dtypes) floor_bytes = std::max(floor_bytes, output_bytes(state_, d));
  if (floor_.size() < floor_bytes) {
    floor_.assign(floor_bytes, 1);  // touched: the floor copies into warm memory
  }

  const std::string raw_path = (work / "raw.bin").string();
  const std::string torch_path = (work / "torch.pt").string();
  for (int rep = 0; rep < spec.reps; ++rep) {
    const std::string at =
        spec.progress + "rep " + std::to_string(rep + 1) + "/" + std::to_string(spec.reps) + ": ";
    progress_.show(at + "raw write");
    r.get("raw_write").s.add(raw.write(raw_path, in_bytes, direct, spec.raw_read));
    if (spec.raw_read) {
      progress_.show(at + "raw read");
      try {
        r.get("raw_read").s.add(raw.read(raw_path, direct));
      } catch (...) {
        fs::remove(raw_path);
        throw;
      }
      fs::remove(raw_path);
    }

    for (size_t i = 0; i < spec.dtypes.size(); ++i) {
      const std::string key = i == 0 ? "" : "_" + dtype_suffix(spec.dtypes[i]);
      progress_.show(at + "tsnap save" + (i == 0 ? "" : " " + dtype_suffix(spec.dtypes[i])));
      const std::string name = "snap-" + std::to_string(index) + "-" + std::to_string(rep) + key;
      SaveOptions save;
      save.dtype = spec.dtypes[i];
      save.staging = spec.lazy ? Staging::kLazy : Staging::kEager;
      const double cpu0 = process_cpu_s();
      const auto t0 = Clock::now();
      SaveHandle h = snap.save_async(name, state_, nlohmann::json::object(), save);
      if (spec.lazy) {
        h.wait_staged();  // what the caller waits for before it next changes its tensors
        r.get("tsnap_staged" + key).s.add(since(t0));
      }
      h.wait();
      if (i == 0) r.cpu_s.add(process_cpu_s() - cpu0);
      const SaveStats st = h.stats();
      r.get("tsnap_save" + key).s.add(st.total_s);
      r.get("tsnap_save" + key).bytes = st.bytes;
      r.get("tsnap_stall" + key).s.add(st.stall_s);
      r.get("tsnap_stage" + key).s.add(st.stage_s);
      r.get("memcpy" + key).s.add(memcpy_2threads(state_, spec.dtypes[i], floor_.data()));
      if (spec.dtypes[i]) {
        r.get("convert" + key)
            .s.add(memcpy_2threads(state_, spec.dtypes[i], floor_.data(), /*convert=*/true));
      }
      if (spec.restore && i == 0) {
        // Cold: O_DIRECT writes leave most of the files out of the page cache, but not
        // necessarily all (buffered fallbacks, the manifest): evicted first. Warm: read once.
        progress_.show(at + "tsnap load");
        for (const std::string& f : files_under(h.path())) evict_from_cache(f);
        // Timed until load returns: freeing the tensors afterwards is not the load's cost.
        auto t1 = Clock::now();
        {
          const StateDict back = tsnap::load(h.path());
          r.get("tsnap_load").s.add(since(t1));
        }
        r.get("tsnap_load").bytes = st.tensor_bytes;
        for (const std::string& f : files_under(h.path())) buffered_read(f);
        t1 = Clock::now();
        {
          const StateDict back = tsnap::load(h.path());
          r.get("tsnap_load_warm").s.add(since(t1));
        }
        r.get("tsnap_load_warm").bytes = st.tensor_bytes;
        // What `tsnap verify` does: every chunk of every file read and hashed, from the disk.
        progress_.show(at + "tsnap verify");
        for (const std::string& f : files_under(h.path())) evict_from_cache(f);
        t1 = Clock::now();
        if (!tsnap::verify(h.path()).empty()) {
          throw_error(ErrorCode::kHashMismatch, "the benchmark's snapshot fails verification");
        }
        r.get("tsnap_verify").s.add(since(t1));
        r.get("tsnap_verify").bytes = st.bytes;
      }
      detail::remove_tree(h.path().string());
    }

    if (spec.torch_save) {
      progress_.show(at + "torch::save");
      r.get("torch_save").s.add(torch_save_fsync(state_, torch_path, spec.torch_load));
      if (spec.torch_load) {
        progress_.show(at + "torch::load");
        try {
          evict_from_cache(torch_path);
          r.get("torch_load").s.add(torch_load(torch_path));
          buffered_read(torch_path);
          r.get("torch_load_warm").s.add(torch_load(torch_path));
        } catch (...) {
          fs::remove(torch_path);
          throw;
        }
        fs::remove(torch_path);
      }
    }
  }
  return r;
}

std::vector<PointResult> run_sweep(const BenchOptions& o, const StateDict& state,
                                   const fs::path& work, Progress& progress) {
  const Sweep sweep = parse_sweep(o.sweep);
  const uint64_t out_bytes = output_bytes(state, dtype_of(o.dtype));
  SaveRunner runner(state, progress);
  std::vector<PointResult> results;
  const size_t points = sweep.param.empty() ? 1 : sweep.values.size();
  for (size_t i = 0; i < points; ++i) {
    PointSpec spec{.snapshotter = snapshotter_options(o, out_bytes, work),
                   .dtypes = {dtype_of(o.dtype)},
                   .lazy = o.lazy,
                   .reps = o.reps,
                   .raw_read = true,
                   .restore = !o.no_restore,
                   .torch_save = !o.no_torch,
                   .torch_load = !o.no_torch};
    if (!sweep.param.empty()) {
      spec.value = sweep.values[i];
      spec.progress = "[" + sweep.param + "=" + spec.value + "] ";
      apply_sweep_value(sweep.param, spec.value, &spec.snapshotter);
    }
    results.push_back(runner.run(spec, i));
  }
  return results;
}

SmallVsLarge run_small_vs_large(Snapshotter& snap, int reps) {
  const StateDict small = small_tensors(10000);
  SmallVsLarge out;
  out.bytes = output_bytes(small, std::nullopt);
  const StateDict large = large_tensors(out.bytes, 8);
  for (int r = 0; r < reps; ++r) {
    const auto save = [&](const char* name, const StateDict& state) {
      SaveHandle h = snap.save_async(name, state);
      h.wait();
      return h;
    };
    SaveHandle a, b;
    if (r % 2 == 0) {
      a = save("small", small);
      b = save("large", large);
    } else {
      b = save("large", large);
      a = save("small", small);
    }
    out.small.add(a.stats().total_s);
    out.small_stall.add(a.stats().stall_s);
    out.small_commit.add(a.stats().commit_s);
    out.large.add(b.stats().total_s);
    out.large_stall.add(b.stats().stall_s);
    out.large_commit.add(b.stats().commit_s);
    out.ratio.add(b.stats().total_s / a.stats().total_s);
    detail::remove_tree(a.path().string());
    detail::remove_tree(b.path().string());
  }
  return out;
}

Soak run_soak(Snapshotter& snap, const StateDict& state, int saves) {
  Soak out;
  out.saves = saves;
  out.min_kib = LONG_MAX;
  fs::path path;
  for (int i = 0; i < saves; ++i) {
    SaveHandle h = snap.save_async("soak", state, {}, {.overwrite = true});
    h.wait();
    path = h.path();
    const long r = rss_kib();
    if (i == 0) out.first_kib = r;
    out.last_kib = r;
    out.min_kib = std::min(out.min_kib, r);
    out.max_kib = std::max(out.max_kib, r);
  }
  if (!path.empty()) detail::remove_tree(path.string());
  return out;
}

}  // namespace tsnap::bench
