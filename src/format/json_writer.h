#pragma once
// A minimal streaming JSON writer: appends compact JSON to a std::string without building a
// document tree (nlohmann::json allocates a map node per key, which dominates for 10k tensors).

#include <cstdint>
#include <string>
#include <string_view>

namespace tsnap::format {

/// Appends JSON text to `out`. The caller pairs begin/end calls and writes a key before each
/// member of an object; the writer only inserts the commas. Strings are escaped as JSON needs
/// and must be valid UTF-8 (else InvalidArgument, naming the string).
class JsonWriter {
 public:
  explicit JsonWriter(std::string& out) : out_(out) {}

  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }

  void key(std::string_view k);
  void string(std::string_view s);
  void number(uint64_t v);
  void number(int64_t v);
  /// Pre-serialised JSON (one complete value), appended as is.
  void raw(std::string_view json);
  /// Starts the next key or value (after its comma) on a new line; keeps long output diffable.
  void newline() { newline_ = true; }

 private:
  void separate() {
    if (need_comma_) out_ += ',';
    line_break();
  }
  void line_break() {
    if (newline_) out_ += '\n';
    newline_ = false;
  }
  void open(char c) {
    separate();
    out_ += c;
    need_comma_ = false;
  }
  void close(char c) {
    line_break();
    out_ += c;
    need_comma_ = true;
  }

  std::string& out_;
  bool need_comma_ = false;  ///< The next key or value follows a sibling.
  bool newline_ = false;     ///< newline() was called since the last token.
};

/// Appends `s` to `out` as a quoted JSON string; throws InvalidArgument when `s` is not UTF-8.
void append_json_string(std::string& out, std::string_view s);

}  // namespace tsnap::format
