// Fuzz target: MANIFEST.json text parsed and validated (format/manifest_io.h). A manifest the
// parser accepts must survive the writers: manifest_to_text of it parses again to the same
// text (its checksum included), and says the same JSON as manifest_to_json (but the checksum).

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "format/manifest_io.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tsnap;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Manifest m;
  if (!fuzz::accepts("parse_manifest", [&] { m = format::parse_manifest(text, "fuzz"); })) {
    return 0;
  }
  std::string written;
  if (!fuzz::accepts("manifest_to_text", [&] { written = format::manifest_to_text(m); })) {
    return 0;  // what the writer refuses to write (reported as InvalidArgument)
  }
  try {
    nlohmann::json as_written = nlohmann::json::parse(written);
    as_written.erase("checksum");  // the text's own checksum, which the JSON form lacks
    if (as_written != format::manifest_to_json(m)) {
      fuzz::fail("manifest_to_text and manifest_to_json disagree");
    }
    if (format::manifest_to_text(format::parse_manifest(written, "rewritten")) != written) {
      fuzz::fail("a written manifest does not read back to the same text");
    }
  } catch (const std::exception& e) {
    fuzz::fail(std::string("the parser rejects manifest_to_text's output: ") + e.what());
  }
  return 0;
}
