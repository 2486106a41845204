#include "common/owner_process.h"

#include <unistd.h>

#include <string>

#include "tsnap/error.h"

namespace tsnap::detail {

OwnerProcess::OwnerProcess() : pid_(::getpid()) {}

bool OwnerProcess::forked() const { return ::getpid() != pid_; }

void OwnerProcess::check(const char* what) const {
  if (!forked()) return;
  throw_error(ErrorCode::kUnsupported,
              std::string(what) + " was created in process " + std::to_string(pid_) +
                  ", and this is a child forked from it (process " + std::to_string(::getpid()) +
                  "): its background threads do not exist here, so it cannot save or wait. "
                  "Use it in the parent, or create a new one in the child");
}

}  // namespace tsnap::detail
