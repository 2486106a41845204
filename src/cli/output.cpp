#include "cli/output.h"

#include <cstdio>
#include <ctime>
#include <string_view>
#include <system_error>

#include "format/dtype.h"
#include "tsnap/manifest.h"

namespace tsnap::cli {

std::string dtype_string(at::ScalarType t) { return std::string(format::dtype_name(t)); }

std::string local_time(int64_t unix_ns) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  localtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &tm);
  return text;
}

std::string plain_message(const std::string& message) {
  static constexpr std::string_view kPrefix = "tsnap: ";
  if (message.compare(0, kPrefix.size(), kPrefix) == 0) return message.substr(kPrefix.size());
  return message;
}

uint64_t manifest_bytes(const std::filesystem::path& snapshot) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(snapshot / kManifestName, ec);
  return ec ? 0 : size;
}

}  // namespace tsnap::cli
