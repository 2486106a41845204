// Saves a tiny state with an installed tsnap, loads it back, checks it, and prints "ok".
//   consumer DIR   (DIR/snap is created)

#include <ATen/ATen.h>
#include <tsnap/tsnap.h>  // the umbrella: every public header

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace {

bool check(bool condition, const std::string& what) {
  if (!condition) std::fprintf(stderr, "consumer: %s\n", what.c_str());
  return condition;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer DIR\n");
    return 2;
  }
  const std::filesystem::path path = std::filesystem::path(argv[1]) / "snap";
  try {
    const tsnap::StateDict state{{"weight", at::arange(12, at::kFloat).reshape({3, 4})},
                                 {"step", at::scalar_tensor(7, at::kLong)}};
    const nlohmann::json metadata = {{"step", 7}};
    tsnap::save(path, state, metadata);

    const tsnap::StateDict loaded = tsnap::load(path);
    const tsnap::Manifest manifest = tsnap::read_manifest(path);
    bool ok = check(loaded.keys() == state.keys(), "loaded keys differ");
    for (const std::string& key : state.keys()) {
      ok &= check(loaded.contains(key) && at::equal(loaded.at(key), state.at(key)),
                  key + " differs after load");
    }
    ok &= check(manifest.metadata == metadata, "metadata differs");
    ok &= check(tsnap::verify(path).empty(), "verify found bad chunks");

    // The asynchronous path through the exported Snapshotter and SaveHandle.
    tsnap::SnapshotterOptions options;
    options.root = std::filesystem::path(argv[1]) / "root";
    tsnap::Snapshotter snapshotter(options);
    tsnap::SaveHandle handle = snapshotter.save_async("step-00000007", state, metadata);
    handle.wait();
    ok &= check(tsnap::latest(options.root) == options.root / "step-00000007", "latest differs");
    try {
      tsnap::load(options.root / "missing");
      ok &= check(false, "loading a missing snapshot did not throw");
    } catch (const tsnap::Error&) {  // the exception's type crosses the library boundary
    }
    if (!ok) return 1;
  } catch (const tsnap::Error& e) {
    std::fprintf(stderr, "consumer: tsnap error: %s\n", e.what());
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
