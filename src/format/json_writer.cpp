#include "format/json_writer.h"

#include <charconv>

#include "common/hex.h"
#include "format/dtype.h"
#include "tsnap/error.h"

namespace tsnap::format {
namespace {

/// Length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, at most
/// U+10FFFF) that starts at s[i] with a byte >= 0x80, or 0 when there is none.
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) -> unsigned {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u;
  };
  const auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    const unsigned b = byte(k);
    return b >= lo && b <= hi;
  };
  const unsigned b0 = byte(0);
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 2 : 0;
  if (b0 == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if (b0 == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
  if (b0 >= 0xE1 && b0 <= 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (b0 == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (b0 >= 0xF1 && b0 <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (b0 == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

template <class Int>
void append_int(std::string& out, Int v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  constexpr const char* kHex = detail::kHexDigits;
  out += '"';
  size_t run = 0;  // Start of the bytes not yet appended: copied in runs, not byte by byte.
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      const size_t n = utf8_sequence(s, i);
      if (n == 0) {
        throw_error(
            ErrorCode::kInvalidArgument,
            "string '" + printable(s) + "' is not valid UTF-8 (byte " + std::to_string(i) + ")");
      }
      i += n;
      continue;
    }
    out.append(s.data() + run, i - run);
    out += '\\';
    switch (c) {
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case '\b':
        out += 'b';
        break;
      case '\f':
        out += 'f';
        break;
      case '\n':
        out += 'n';
        break;
      case '\r':
        out += 'r';
        break;
      case '\t':
        out += 't';
        break;
      default:
        out += "u00";
        out += kHex[c >> 4];
        out += kHex[c & 0xF];
    }
    run = ++i;
  }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}

void JsonWriter::key(std::string_view k) {
  separate();
  append_json_string(out_, k);
  out_ += ':';
  need_comma_ = false;
}

void JsonWriter::string(std::string_view s) {
  separate();
  append_json_string(out_, s);
  need_comma_ = true;
}

void JsonWriter::number(uint64_t v) {
  separate();
  append_int(out_, v);
  need_comma_ = true;
}

void JsonWriter::number(int64_t v) {
  separate();
  append_int(out_, v);
  need_comma_ = true;
}

void JsonWriter::raw(std::string_view json) {
  separate();
  out_ += json;
  need_comma_ = true;
}

}  // namespace tsnap::format
