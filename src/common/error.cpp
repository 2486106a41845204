#include "tsnap/error.h"

#include <algorithm>
#include <cstddef>
#include <string_view>

#include "common/hex.h"

namespace tsnap {
namespace {

// Longest message an error carries: quoted values (keys, names, file contents) may be of any
// length, and a message must stay readable in a log line.
constexpr size_t kMaxMessage = 4096;

// Length of the valid UTF-8 sequence at the start of `s`, or 0 when its first byte does not
// start one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut).
size_t utf8_sequence(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // bounds of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (s.size() < n || b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (b(i) < 0x80 || b(i) > 0xbf) return 0;
  }
  return n;
}

// `text` as valid UTF-8 (bytes that are not: \xHH) of at most about kMaxMessage bytes (the
// middle of a longer one cut, never inside a character).
std::string readable_message(std::string_view text) {
  std::string out;
  out.reserve(std::min(text.size(), kMaxMessage + 64));
  const size_t head = kMaxMessage * 3 / 4, tail = kMaxMessage / 4;
  size_t i = 0;
  bool cut = false;
  while (i < text.size()) {
    if (!cut && out.size() >= head && text.size() - i > tail + 64) {
      // Skip to the last `tail` bytes, at the start of a character.
      size_t resume = text.size() - tail;
      while (resume < text.size() && (static_cast<unsigned char>(text[resume]) & 0xc0) == 0x80) {
        ++resume;
      }
      out += " [... " + std::to_string(resume - i) + " bytes cut ...] ";
      i = resume;
      cut = true;
      continue;
    }
    const size_t n = utf8_sequence(text.substr(i));
    if (n == 0) {
      detail::append_escaped_byte(out, static_cast<unsigned char>(text[i]));
      ++i;
    } else {
      out.append(text.data() + i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace

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
    case ErrorCode::kStale:
      return "stale";
  }
  return "unknown";
}

std::exception_ptr make_error(ErrorCode code, const std::string& text, int sys_errno) {
  const std::string message = readable_message(text);
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
