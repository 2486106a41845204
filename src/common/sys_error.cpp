#include "common/sys_error.h"

#include <cerrno>
#include <cstring>

#include "tsnap/error.h"

namespace tsnap::detail {

std::exception_ptr sys_error(int neg_errno, const std::string& what) {
  const int e = neg_errno < 0 ? -neg_errno : neg_errno;
  const ErrorCode code = (e == ENOSPC || e == EDQUOT) ? ErrorCode::kNoSpace : ErrorCode::kIo;
  return make_error(code, what + ": " + std::strerror(e) + " (errno " + std::to_string(e) + ")", e);
}

void throw_sys_error(int neg_errno, const std::string& what) {
  std::rethrow_exception(sys_error(neg_errno, what));
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown error";
  }
}

std::string first_line(const std::string& message) { return message.substr(0, message.find('\n')); }

}  // namespace tsnap::detail
