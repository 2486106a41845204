#include "tsnap/error.h"

namespace tsnap {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kKeyNotFound:
      return "key_not_found";
    case ErrorCode::kShapeMismatch:
      return "shape_mismatch";
    case ErrorCode::kAlreadyExists:
      return "already_exists";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kNoSpace:
      return "no_space";
    case ErrorCode::kBadHeader:
      return "bad_header";
    case ErrorCode::kHeaderTooLarge:
      return "header_too_large";
    case ErrorCode::kBadOffsets:
      return "bad_offsets";
    case ErrorCode::kBadManifest:
      return "bad_manifest";
    case ErrorCode::kUnsupportedFormat:
      return "unsupported_format";
    case ErrorCode::kUnsafePath:
      return "unsafe_path";
    case ErrorCode::kTruncated:
      return "truncated";
    case ErrorCode::kHashMismatch:
      return "hash_mismatch";
    case ErrorCode::kBusy:
      return "busy";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kPeerFailed:
      return "peer_failed";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::exception_ptr make_error(ErrorCode code, const std::string& message, int sys_errno) {
  switch (error_class(code)) {
    case ErrorClass::kInvalidArgument:
      return std::make_exception_ptr(InvalidArgument(code, message, sys_errno));
    case ErrorClass::kIoError:
      return std::make_exception_ptr(IoError(code, message, sys_errno));
    case ErrorClass::kFormatError:
      return std::make_exception_ptr(FormatError(code, message, sys_errno));
    case ErrorClass::kError:
      break;
  }
  return std::make_exception_ptr(Error(code, message, sys_errno));
}

void throw_error(ErrorCode code, const std::string& message, int sys_errno) {
  std::rethrow_exception(make_error(code, message, sys_errno));
}

}  // namespace tsnap
