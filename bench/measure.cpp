#include "bench/measure.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "common/anon_memory.h"
#include "format/convert.h"
#include "io/fd.h"

namespace fs = std::filesystem;

namespace tsnap::bench {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Series::median() const {
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  if (s.empty()) return 0;
  return s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
}
double Series::min() const { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double Series::max() const { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  }
  return 0;
}

long rss_kib() { return status_kib("VmRSS:"); }

long peak_rss_kib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

double process_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

void evict_from_cache(const std::string& path) {
  int err = 0;
  const io::UniqueFd fd = io::open_fd(path, O_RDONLY, 0, &err);
  if (!fd.valid()) throw std::runtime_error("open " + path + ": " + std::strerror(-err));
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
}

std::vector<std::string> files_under(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(e.path().string());
  }
  return out;
}

namespace {

// Bytes of `t` once stored as `dtype` (floating tensors only; unset keeps its dtype).
uint64_t stored_bytes(const at::Tensor& t, std::optional<at::ScalarType> dtype) {
  const bool floating = at::isFloatingType(t.scalar_type());
  return t.numel() * (dtype && floating ? c10::elementSize(*dtype) : t.element_size());
}

}  // namespace

uint64_t output_bytes(const StateDict& sd, std::optional<at::ScalarType> dtype) {
  uint64_t n = 0;
  for (const auto& [k, e] : sd) n += stored_bytes(e.tensor, dtype);
  return n;
}

double memcpy_2threads(const StateDict& sd, std::optional<at::ScalarType> dtype, uint8_t* dst,
                       bool convert) {
  // The same output bytes: for a converted state, copy as many source bytes as the convert
  // writes, so that the floor counts output bandwidth only (unless `convert`).
  std::vector<std::pair<const uint8_t*, uint64_t>> pieces;
  std::vector<const at::Tensor*> tensors;
  for (const auto& [k, e] : sd) {
    pieces.push_back(
        {static_cast<const uint8_t*>(e.tensor.data_ptr()), stored_bytes(e.tensor, dtype)});
    tensors.push_back(&e.tensor);
  }
  std::vector<uint64_t> offsets(pieces.size() + 1, 0);
  for (size_t i = 0; i < pieces.size(); ++i) offsets[i + 1] = offsets[i] + pieces[i].second;
  const auto t0 = Clock::now();
  std::thread threads[2];
  for (int t = 0; t < 2; ++t) {
    threads[t] = std::thread([&, t] {
      for (size_t i = t; i < pieces.size(); i += 2) {
        const at::Tensor& t = *tensors[i];
        if (convert && dtype && at::isFloatingType(t.scalar_type())) {
          format::convert(pieces[i].first, t.scalar_type(), dst + offsets[i], *dtype,
                          static_cast<size_t>(t.numel()));
        } else {
          std::memcpy(dst + offsets[i], pieces[i].first, pieces[i].second);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  return since(t0);
}

double memset_first_touch(uint64_t bytes) {
  const detail::AnonMemory memory(bytes, /*huge=*/true, "first-touch baseline");
  const auto t0 = Clock::now();
  std::memset(memory.data(), 0, memory.size());
  return since(t0);
}

double torch_save_fsync(const StateDict& sd, const std::string& path, bool keep) {
  std::vector<at::Tensor> tensors;
  for (const auto& [k, e] : sd) tensors.push_back(e.tensor);
  const auto t0 = Clock::now();
  try {
    torch::save(tensors, path);
  } catch (...) {
    fs::remove(path);
    throw;
  }
  int err = 0;
  io::UniqueFd fd = io::open_fd(path, O_RDONLY, 0, &err);
  const int rc = fd.valid() ? ::fsync(fd.get()) : -1;
  fd.reset();
  const double t = since(t0);
  if (rc != 0 || !keep) fs::remove(path);
  if (rc != 0) throw std::runtime_error("torch::save: fsync of " + path + " failed");
  return t;
}

double torch_load(const std::string& path) {
  std::vector<at::Tensor> tensors;
  const auto t0 = Clock::now();
  torch::load(tensors, path);
  return since(t0);
}

double buffered_read(const std::string& path) {
  const auto t0 = Clock::now();
  int err = 0;
  const io::UniqueFd fd = io::open_fd(path, O_RDONLY, 0, &err);
  if (!fd.valid()) throw std::runtime_error("open " + path + ": " + std::strerror(-err));
  std::vector<char> buf(16 << 20);
  while (::read(fd.get(), buf.data(), buf.size()) > 0) {
  }
  return since(t0);
}

}  // namespace tsnap::bench
