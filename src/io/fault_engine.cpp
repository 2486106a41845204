#include "io/fault_engine.h"

namespace tsnap::io {

void FaultInjectingEngine::write(int fd, const void* buf, size_t len, uint64_t offset,
                                 int buf_index, Done done) {
  if (hit(writes_, faults_.fail_write)) return done(-faults_.error);
  if (faults_.space_bytes > 0 && (written_ += len) > faults_.space_bytes) return done(-ENOSPC);
  ForwardingEngine::write(fd, buf, len, offset, buf_index, std::move(done));
}

void FaultInjectingEngine::read(int fd, void* buf, size_t len, uint64_t offset, int buf_index,
                                Done done) {
  if (hit(reads_, faults_.fail_read)) return done(-faults_.error);
  ForwardingEngine::read(fd, buf, len, offset, buf_index, std::move(done));
}

void FaultInjectingEngine::readv(int fd, const iovec* iov, int iovcnt, uint64_t offset, Done done) {
  if (hit(reads_, faults_.fail_read)) return done(-faults_.error);  // counted as reads
  ForwardingEngine::readv(fd, iov, iovcnt, offset, std::move(done));
}

int FaultInjectingEngine::open(const std::string& path, int flags, mode_t mode) {
  if (hit(opens_, faults_.fail_open)) return -faults_.error;
  return ForwardingEngine::open(path, flags, mode);
}

int FaultInjectingEngine::fsync(int fd) {
  if (hit(fsyncs_, faults_.fail_fsync)) return -faults_.error;
  return ForwardingEngine::fsync(fd);
}

int FaultInjectingEngine::ftruncate(int fd, uint64_t size) {
  if (hit(truncates_, faults_.fail_ftruncate)) return -faults_.error;
  return ForwardingEngine::ftruncate(fd, size);
}

int FaultInjectingEngine::mkdir(const std::string& path) {
  if (hit(mkdirs_, faults_.fail_mkdir)) return -faults_.error;
  return ForwardingEngine::mkdir(path);
}

int FaultInjectingEngine::rename(const std::string& from, const std::string& to, RenameMode mode) {
  if (hit(renames_, faults_.fail_rename)) return -faults_.error;
  return ForwardingEngine::rename(from, to, mode);
}

int FaultInjectingEngine::fsync_dir(const std::string& path) {
  if (hit(dir_syncs_, faults_.fail_fsync_dir)) return -faults_.error;
  return ForwardingEngine::fsync_dir(path);
}

}  // namespace tsnap::io
