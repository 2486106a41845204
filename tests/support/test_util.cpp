#include "support/test_util.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

#include "common/remove_tree.h"
#include "format/hash.h"
#include "format/manifest_internal.h"

namespace tsnap::test_support {

namespace fs = std::filesystem;

namespace {

// A crash in a test prints where it happened to stderr (CI and remote machines have no
// debugger): the faulting instruction, the return address on the stack (what called a bad
// function pointer) and a backtrace.
void describe(const char* what, void* addr) {
  Dl_info info{};
  char line[512];
  const bool known = addr != nullptr && dladdr(addr, &info) != 0;
  const int n = std::snprintf(line, sizeof line, "  %s %p %s(%s)\n", what, addr,
                              known && info.dli_fname ? info.dli_fname : "?",
                              known && info.dli_sname ? info.dli_sname : "?");
  (void)!write(2, line, static_cast<size_t>(n));
}

void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  const char msg[] = "\n*** fatal signal in test\n";
  (void)!write(2, msg, sizeof msg - 1);
  describe("fault address", info->si_addr);
#if defined(__x86_64__)
  const auto* uc = static_cast<const ucontext_t*>(context);
  describe("instruction", reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]));
  describe("return address", *reinterpret_cast<void* const*>(uc->uc_mcontext.gregs[REG_RSP]));
#endif
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

const bool kCrashReporterInstalled = [] {
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal_signal;
  sa.sa_flags = SA_SIGINFO;
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) sigaction(sig, &sa, nullptr);
  return true;
}();

}  // namespace

TempDir::TempDir(const fs::path& base) {
  static std::atomic<int> counter{0};
  std::random_device rd;
  path_ = base / ("tsnap-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) +
                  "-" + std::to_string(rd()));
  fs::create_directories(path_);
}

TempDir::~TempDir() { tsnap::detail::remove_tree(path_.string()); }

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous().cpu();
  const at::Tensor cb = b.contiguous().cpu();
  // An empty tensor's data_ptr() may be null, and memcmp on null is undefined even for 0 bytes.
  return ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

at::Tensor make_tensor(at::ScalarType dtype, at::IntArrayRef shape, uint64_t seed) {
  at::manual_seed(seed);
  if (dtype == at::kBool) return at::randint(0, 2, shape).to(at::kBool);
  if (at::isIntegralType(dtype, /*includeBool=*/false)) {
    const int64_t hi = dtype == at::kByte ? 255 : (dtype == at::kChar ? 127 : 30000);
    const int64_t lo = dtype == at::kByte ? 0 : -hi;
    return at::randint(lo, hi, shape, at::TensorOptions().dtype(dtype));
  }
  return at::randn(shape, at::TensorOptions().dtype(at::kDouble)).mul(100).to(dtype);
}

StateDict mixed_state(uint64_t seed) {
  StateDict sd;
  const at::ScalarType types[] = {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong,
                                  at::kInt,    at::kShort, at::kChar, at::kByte,     at::kBool};
  int i = 0;
  for (at::ScalarType t : types) {
    const std::string name = std::string(c10::toString(t));
    sd.insert("odd." + name, make_tensor(t, {3, 7, 5}, seed + i++));
    sd.insert("scalar." + name, make_tensor(t, {}, seed + i++));
    sd.insert("empty." + name, make_tensor(t, {0, 4}, seed + i++));
    sd.insert("vec." + name, make_tensor(t, {1001}, seed + i++));
  }
  return sd;
}

std::vector<std::string> dir_entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string signed_manifest_text(nlohmann::json manifest) {
  manifest.erase("checksum");
  std::string text = manifest.dump();
  text.pop_back();  // the closing brace
  const uint64_t checksum = format::hash64(text.data(), text.size());
  return text + format::kChecksumMember + format::kChecksumPrefix + format::hex16(checksum) +
         "\"}\n";
}

void flip_byte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + file.string());
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

ReaderRun run_reference_reader(const fs::path& file, bool tsnap_rules) {
  const fs::path script = fs::path(TSNAP_TESTS_DIR) / "format" / "safetensors_reader.py";
  const std::string cmd = "python3 '" + script.string() + "' " + (tsnap_rules ? "--tsnap " : "") +
                          "'" + file.string() + "' 2>&1";
  ReaderRun run;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) run.output.append(buf, n);
  const int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

bool have_python() { return std::system("python3 -c 'import json, struct' >/dev/null 2>&1") == 0; }

StateDict fine_tuning_state(int step) {
  StateDict sd;
  for (int i = 0; i < 6; ++i) {
    sd.insert("backbone.layer" + std::to_string(i) + ".weight",
              make_tensor(at::kFloat, {100, 500}, 100 + i));  // 200 KB each
  }
  sd.insert("backbone.norm", make_tensor(at::kBFloat16, {333}, 7));
  const at::Tensor delta = at::full({}, static_cast<double>(step));
  sd.insert("head.weight", make_tensor(at::kFloat, {50, 300}, 200) + delta);
  sd.insert("opt.head.weight.exp_avg", make_tensor(at::kFloat, {50, 300}, 201) * delta);
  sd.insert("opt.step", at::full({}, step, at::kLong));
  if (step >= 5) sd.insert("buffer.new", make_tensor(at::kFloat, {1000}, 300));
  return sd;
}

}  // namespace tsnap::test_support
