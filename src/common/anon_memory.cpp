#include "common/anon_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include "common/sys_error.h"
#include "common/thread_name.h"
#include "tsnap/error.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it, older kernels say EINVAL
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older kernels say EINVAL
#endif

namespace tsnap::detail {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t round_to_pages(uint64_t bytes) {
  return (std::max<uint64_t>(bytes, 1) + kPage - 1) / kPage * kPage;
}

}  // namespace

AnonMemory::AnonMemory(uint64_t bytes, bool huge, const std::string& what)
    : size_(round_to_pages(bytes)) {
  map(MAP_PRIVATE | MAP_ANONYMOUS, -1, huge, what);
}

std::unique_ptr<AnonMemory> AnonMemory::shared(uint64_t bytes, int fd, bool huge,
                                               const std::string& what) {
  std::unique_ptr<AnonMemory> m(new AnonMemory());
  m->size_ = round_to_pages(bytes);
  const std::string size = std::to_string(m->size_) + " bytes of " + what;
  if (fd < 0) {
    m->fd_ = ::memfd_create(what.c_str(), MFD_CLOEXEC);
    if (m->fd_ < 0) throw_sys_error(-errno, "create shared memory for " + size);
    if (::ftruncate(m->fd_, static_cast<off_t>(m->size_)) != 0) {
      throw_sys_error(-errno, "size shared memory for " + size);
    }
  } else {
    m->fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (m->fd_ < 0) throw_sys_error(-errno, "duplicate the shared memory of " + size);
    struct stat st {};
    if (::fstat(m->fd_, &st) != 0) throw_sys_error(-errno, "stat the shared memory of " + size);
    if (static_cast<uint64_t>(st.st_size) < m->size_) {
      throw_error(ErrorCode::kInvalidArgument, "shared memory of " + std::to_string(st.st_size) +
                                                   " bytes is too small for " + size);
    }
  }
  m->map(MAP_SHARED, m->fd_, huge, what);
  return m;
}

void AnonMemory::map(int flags, int fd, bool huge, const std::string& what) {
  void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) {
    throw_sys_error(-errno, "allocate " + std::to_string(size_) + " bytes of " + what);
  }
  base_ = static_cast<uint8_t*>(p);
  if (huge) (void)::madvise(p, size_, MADV_HUGEPAGE);  // advisory
}

void AnonMemory::resize(uint64_t bytes, const std::string& what) {
  if (fd_ >= 0) {
    throw_error(ErrorCode::kInvalidArgument, "shared memory of " + what + " cannot be resized");
  }
  const uint64_t size = round_to_pages(bytes);
  if (size == size_) return;
  void* p = ::mremap(base_, size_, size, MREMAP_MAYMOVE);
  if (p == MAP_FAILED) {
    throw_sys_error(-errno, "resize " + what + " from " + std::to_string(size_) + " to " +
                                std::to_string(size) + " bytes");
  }
  base_ = static_cast<uint8_t*>(p);
  size_ = size;
}

AnonMemory::~AnonMemory() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

bool populate_untouched(uint8_t* p, uint64_t len) {
  if (len == 0) return true;
  const auto start = reinterpret_cast<uintptr_t>(p) / kPage * kPage;
  const auto end = reinterpret_cast<uintptr_t>(p) + len;
  return ::madvise(reinterpret_cast<uint8_t*>(start), end - start, MADV_POPULATE_WRITE) == 0;
}

bool collapse_into_huge_pages(uint8_t* p, uint64_t len) {
  constexpr uintptr_t kHuge = 2ull << 20;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) / kHuge * kHuge;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + len) / kHuge * kHuge;
  if (end <= start) return false;
  return ::madvise(reinterpret_cast<uint8_t*>(start), end - start, MADV_COLLAPSE) == 0;
}

void populate(uint8_t* p, uint64_t len) {
  if (populate_untouched(p, len)) return;
  const auto start = reinterpret_cast<uintptr_t>(p) / kPage * kPage;
  const auto end = reinterpret_cast<uintptr_t>(p) + len;
  for (uintptr_t at = start; at < end; at += kPage) {
    volatile uint8_t* b = reinterpret_cast<uint8_t*>(at);
    *b = *b;
  }
}

void populate_in_parallel(uint8_t* p, uint64_t len) {
  constexpr uint64_t kMinSlice = 64ull << 20;  // not worth a thread below this
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t n = std::clamp<uint64_t>(len / kMinSlice, 1, cores);
  const uint64_t slice = (len / n + kPage - 1) / kPage * kPage;
  std::vector<std::thread> threads;
  for (uint64_t i = 1; i < n && i * slice < len; ++i) {
    try {
      threads.emplace_back([=] {
        name_this_thread("tsnap-fault");
        populate(p + i * slice, std::min(slice, len - i * slice));
      });
    } catch (const std::system_error&) {
      populate(p + i * slice, std::min(slice, len - i * slice));  // no thread: do it here
    }
  }
  populate(p, std::min(slice, len));
  for (std::thread& t : threads) t.join();
}

}  // namespace tsnap::detail
