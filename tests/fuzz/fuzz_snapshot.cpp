// Fuzz target: a whole snapshot directory through the public read API. The input is a snapshot
// container (fuzz_util.h: MANIFEST.json and shard files; the seeds are real snapshots) written
// to a directory, then tsnap::verify, tsnap::load and tsnap::open with every tensor read. Loads
// and reads skip hash checks: a mutated byte would otherwise stop every call at the first
// chunk, before the offsets and sizes it is meant to reach are used.

#include <ATen/ATen.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "tsnap/load.h"
#include "tsnap/reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tsnap;
  const std::string dir =
      fuzz::write_dir(fuzz::unpack({reinterpret_cast<const char*>(data), size}));
  fuzz::accepts("verify", [&] { verify(dir); });
  fuzz::accepts("load", [&] {
    const StateDict sd = load(dir, {.verify = false, .read_budget_bytes = 1 << 20});
    for (const auto& [key, entry] : sd) entry.tensor.sum();  // touch every byte
  });
  fuzz::accepts("open", [&] {
    const SnapshotReader r = open(dir, {.verify = false});
    for (const std::string& key : r.keys()) {
      const at::Tensor t = r.read(key);
      t.sum();
      if (t.dim() > 0) r.read_rows(key, 0, std::min<int64_t>(1, t.size(0)));
    }
  });
  return 0;
}
