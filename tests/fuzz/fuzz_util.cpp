#include "fuzz_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "common/remove_tree.h"

namespace tsnap::fuzz {
namespace {

constexpr size_t kMaxFiles = 8;
constexpr size_t kMaxName = 100;

bool plain_name(std::string_view name) {
  return !name.empty() && name.size() <= kMaxName && name != "." && name != ".." &&
         name.find('/') == std::string_view::npos;
}

// POSIX calls, not std::filesystem (see common/remove_tree.h: the torch wheel's own copy).
void write_file(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("fuzz: cannot create " + path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) fail("fuzz: cannot write " + path);
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

std::string make_base() {
  std::string base;
  if (const char* env = std::getenv("TSNAP_FUZZ_TMPDIR")) {
    base = env;
  } else if (::access("/dev/shm", W_OK) == 0) {
    base = "/dev/shm";  // no disk writes for millions of inputs
  } else if (const char* tmp = std::getenv("TMPDIR")) {
    base = tmp;
  } else {
    base = "/tmp";
  }
  std::string path = base + "/tsnap-fuzz-XXXXXX";
  if (::mkdtemp(path.data()) == nullptr) fail("fuzz: cannot create a directory under " + base);
  // Removed at exit (libFuzzer exits through exit() at the end of a run and after a crash).
  static std::string at_exit;
  at_exit = path;
  std::atexit([] { tsnap::detail::remove_tree(at_exit); });
  return path;
}

}  // namespace

void fail(const std::string& what) {
  std::fprintf(stderr, "\n*** tsnap fuzz oracle: %s\n", what.c_str());
  std::abort();
}

void rejected(const char* what, const Error& e) {
  static const bool verbose = std::getenv("TSNAP_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "fuzz: %s: %s: %s\n", what, to_string(e.code()), e.what());
}

std::string pack(const std::vector<File>& files) {
  std::string out;
  for (const File& f : files) {
    out += f.name;
    out += '\0';
    const uint32_t n = static_cast<uint32_t>(f.bytes.size());
    for (int i = 0; i < 4; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
    out += f.bytes;
  }
  return out;
}

std::vector<File> unpack(std::string_view input) {
  std::vector<File> files;
  while (!input.empty()) {
    const size_t nul = input.find('\0');
    if (nul == std::string_view::npos || input.size() - nul - 1 < 4) break;
    const std::string_view name = input.substr(0, nul);
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) {
      n |= uint32_t{static_cast<unsigned char>(input[nul + 1 + i])} << (8 * i);
    }
    input.remove_prefix(nul + 5);
    const std::string_view bytes = input.substr(0, n);
    input.remove_prefix(bytes.size());
    if (plain_name(name) && files.size() < kMaxFiles) {
      files.push_back({std::string(name), std::string(bytes)});
    }
  }
  return files;
}

std::string write_dir(const std::vector<File>& files) {
  static const std::string dir = make_base();
  const int rc = tsnap::detail::remove_tree(dir);
  if (rc < 0 || ::mkdir(dir.c_str(), 0755) != 0) fail("fuzz: cannot empty " + dir);
  for (const File& f : files) write_file(dir + "/" + f.name, f.bytes);
  return dir;
}

}  // namespace tsnap::fuzz
