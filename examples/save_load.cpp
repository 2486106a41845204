// Saves a GPT-2-shaped model state with tsnap while "training" goes on, in fp32 and in bf16,
// loads both snapshots back and checks that they hold exactly what was saved.
//
//   tsnap_example_save_load [--mb N] [--dir DIR]
//
// --mb N   size of the fp32 state in MB (1e6 bytes), default 300; GPT-2 small is ~500.
// --dir D  where to write the snapshots (kept); default: a temporary directory, removed at exit.

#include <ATen/ATen.h>
#include <tsnap/error.h>
#include <tsnap/load.h>
#include <tsnap/remove.h>
#include <tsnap/snapshotter.h>
#include <tsnap/state_dict.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

namespace fs = std::filesystem;

namespace {

struct Args {
  double mb = 300;
  fs::path dir;  // empty: a temporary directory
};

[[noreturn]] void usage(const char* message) {
  if (message != nullptr) std::fprintf(stderr, "error: %s\n", message);
  std::fprintf(message != nullptr ? stderr : stdout,
               "usage: tsnap_example_save_load [--mb N] [--dir DIR]\n"
               "  --mb N    size of the fp32 model state in MB (default 300)\n"
               "  --dir D   write the snapshots to D and keep them (default: a temporary\n"
               "            directory, removed at exit)\n");
  std::exit(message != nullptr ? 2 : 0);
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(nullptr);
    if (arg != "--mb" && arg != "--dir") usage(("unknown option " + arg).c_str());
    if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
    const char* value = argv[++i];
    if (arg == "--mb") {
      char* end = nullptr;
      args.mb = std::strtod(value, &end);
      if (*end != '\0' || !(args.mb > 0)) usage("--mb takes a positive number");
    } else {
      args.dir = value;
    }
  }
  return args;
}

// The shapes of GPT-2 small (d_model 768, context 1024) with as many layers as fit the size;
// below ~190 MB one layer and a smaller vocabulary.
struct GptShape {
  int64_t vocab = 50257;
  int64_t context = 1024;
  int64_t width = 768;
  int64_t layers = 12;
};

GptShape shape_for(double bytes) {
  GptShape s;
  const double target = bytes / sizeof(float);
  const double d = static_cast<double>(s.width);
  const double per_layer = 12 * d * d + 13 * d;
  const double fixed = static_cast<double>(s.context) * d + 2 * d;  // wpe, ln_f
  const double embedding = static_cast<double>(s.vocab) * d;
  if (target >= fixed + embedding + per_layer) {
    s.layers = std::max<int64_t>(1, std::llround((target - fixed - embedding) / per_layer));
  } else {
    s.layers = 1;
    s.vocab = std::max<int64_t>(1, std::llround((target - fixed - per_layer) / d));
  }
  return s;
}

// Named like Hugging Face's GPT-2 state dict, plus the optimizer's integer step counter.
tsnap::StateDict make_state(const GptShape& s) {
  const int64_t d = s.width;
  tsnap::StateDict state;
  auto weight = [&](const std::string& name, at::IntArrayRef shape) {
    state.insert(name, at::randn(shape) * 0.02);
  };
  auto layer_norm = [&](const std::string& name) {
    state.insert(name + ".weight", at::ones({d}));
    state.insert(name + ".bias", at::zeros({d}));
  };
  weight("wte.weight", {s.vocab, d});
  weight("wpe.weight", {s.context, d});
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    layer_norm(h + "ln_1");
    weight(h + "attn.c_attn.weight", {d, 3 * d});
    weight(h + "attn.c_attn.bias", {3 * d});
    weight(h + "attn.c_proj.weight", {d, d});
    weight(h + "attn.c_proj.bias", {d});
    layer_norm(h + "ln_2");
    weight(h + "mlp.c_fc.weight", {d, 4 * d});
    weight(h + "mlp.c_fc.bias", {4 * d});
    weight(h + "mlp.c_proj.weight", {4 * d, d});
    weight(h + "mlp.c_proj.bias", {d});
  }
  layer_norm("ln_f");
  state.insert("step", at::scalar_tensor(0, at::kLong));
  return state;
}

// What a save with `dtype` must store: floating tensors converted, the rest unchanged; always a
// copy, so that later changes to `state` do not show.
tsnap::StateDict expected_copy(const tsnap::StateDict& state, at::ScalarType dtype) {
  tsnap::StateDict copy;
  for (const auto& [key, entry] : state) {
    const at::Tensor& t = entry.tensor;
    copy.insert(key, at::isFloatingType(t.scalar_type()) ? t.to(dtype, false, true) : t.clone());
  }
  return copy;
}

// "" when `got` holds the same keys, dtypes, shapes and bytes as `want`; else the first difference.
std::string compare(const tsnap::StateDict& got, const tsnap::StateDict& want) {
  if (got.keys() != want.keys()) return "different keys";
  for (const auto& [key, entry] : want) {
    const at::Tensor& a = got.at(key);
    const at::Tensor& b = entry.tensor;
    if (a.scalar_type() != b.scalar_type()) return key + ": different dtype";
    if (a.sizes() != b.sizes()) return key + ": different shape";
    if (!at::equal(a, b)) return key + ": different values";
  }
  return "";
}

// One save: starts it, lets "training" change the live tensors while it writes, waits, loads it
// back and compares with what the tensors held at the call.
bool save_and_check(tsnap::Snapshotter& snapshotter, const std::string& name,
                    tsnap::StateDict& state, at::ScalarType dtype) {
  using Clock = std::chrono::steady_clock;
  const tsnap::StateDict want = expected_copy(state, dtype);
  const int64_t step = state.at("step").item<int64_t>();

  tsnap::SaveOptions options;
  options.dtype = dtype;
  options.overwrite = true;  // lets reruns with the same --dir replace earlier snapshots
  const nlohmann::json metadata = {{"step", step}, {"example", "save_load"}};
  tsnap::SaveHandle handle = snapshotter.save_async(name, state, metadata, options);

  // save_async has returned: the snapshot is already point-in-time exact, so the "optimizer"
  // may update the tensors in place while the background pipeline writes.
  for (auto& [key, entry] : state) {
    if (at::isFloatingType(entry.tensor.scalar_type())) entry.tensor.add_(1e-3);
  }
  state.at("step").add_(1);

  handle.wait();
  const tsnap::SaveStats stats = handle.stats();
  const auto load_start = Clock::now();
  const tsnap::StateDict loaded = tsnap::load(handle.path());
  const double load_s = std::chrono::duration<double>(Clock::now() - load_start).count();
  const std::string difference = compare(loaded, want);

  std::printf("%-5s  %8.1f MB  %8.3f s  %8.3f s  %8.2f GB/s  %8.3f s  %-8s  %s\n", name.c_str(),
              stats.bytes / 1e6, stats.stall_s, stats.total_s, stats.throughput_gbps(), load_s,
              stats.engine.c_str(), difference.empty() ? "equal" : difference.c_str());
  return difference.empty();
}

// Removes a temporary directory when it goes out of scope, whatever happened.
struct RemoveAtExit {
  fs::path dir;
  ~RemoveAtExit() {
    try {
      if (!dir.empty()) tsnap::remove_tree(dir);
    } catch (const tsnap::Error& e) {
      std::fprintf(stderr, "could not remove %s: %s\n", dir.c_str(), e.what());
    }
  }
};

int run(const Args& args) {
  const bool temporary = args.dir.empty();
  const fs::path dir =
      temporary ? fs::temp_directory_path() / ("tsnap-example-" + std::to_string(::getpid()))
                : args.dir;
  const RemoveAtExit cleanup{temporary ? dir : fs::path()};
  const GptShape shape = shape_for(args.mb * 1e6);
  at::manual_seed(0);
  tsnap::StateDict state = make_state(shape);
  std::printf("state: GPT-2-shaped, %lld layers, vocab %lld, %zu tensors, %.1f MB fp32\n",
              static_cast<long long>(shape.layers), static_cast<long long>(shape.vocab),
              state.size(), state.nbytes() / 1e6);

  bool ok = true;
  {
    tsnap::SnapshotterOptions options;
    options.root = dir;
    tsnap::Snapshotter snapshotter(options);
    std::printf("snapshots: %s (engine %s)\n\n", dir.c_str(), snapshotter.engine_name().c_str());
    std::printf("%-5s  %11s  %10s  %10s  %13s  %10s  %-8s  %s\n", "save", "written", "stall",
                "total", "throughput", "load", "engine", "check");
    ok &= save_and_check(snapshotter, "fp32", state, at::kFloat);
    ok &= save_and_check(snapshotter, "bf16", state, at::kBFloat16);
  }
  std::printf(
      "\nstall: how long save_async blocked the caller; total: until the snapshot was committed."
      "\n");
  if (!temporary) {
    std::printf("kept: try `tsnap ls %s` and `tsnap inspect %s/bf16`\n", dir.c_str(), dir.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  try {
    return run(args);
  } catch (const tsnap::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}
