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
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

}  // namespace tsnap
