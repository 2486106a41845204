// Fuzz target: S3's XML answers read by io/s3_xml.h, every parser on every input. Each must
// return or refuse with a tsnap::Error (never kInternal, never another exception), in time and
// memory linear in the input. A page it accepts must survive a rewrite: written back as XML
// with s3_xml::escape, it parses to the same page (keys, prefixes, sizes, ETags, markers).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "io/s3_xml.h"

namespace {

using namespace tsnap;
using namespace tsnap::io;

std::string element(const char* tag, const std::string& text) {
  return std::string("<") + tag + ">" + s3_xml::escape(text) + "</" + tag + ">";
}

std::string page_xml(const s3_xml::ObjectPage& p) {
  std::string xml = "<ListBucketResult>";
  for (const S3Object& o : p.objects) {
    xml += "<Contents>" + element("Key", o.key) + element("Size", std::to_string(o.size)) +
           element("ETag", "\"" + o.etag + "\"") + "</Contents>";
  }
  for (const std::string& prefix : p.prefixes) {
    xml += "<CommonPrefixes>" + element("Prefix", prefix) + "</CommonPrefixes>";
  }
  if (!p.next_token.empty()) {
    xml += "<IsTruncated>true</IsTruncated>" + element("NextContinuationToken", p.next_token);
  }
  return xml + "</ListBucketResult>";
}

bool same(const s3_xml::ObjectPage& a, const s3_xml::ObjectPage& b) {
  if (a.objects.size() != b.objects.size() || a.prefixes != b.prefixes ||
      a.next_token != b.next_token) {
    return false;
  }
  for (size_t i = 0; i < a.objects.size(); ++i) {
    const S3Object &x = a.objects[i], &y = b.objects[i];
    if (x.key != y.key || x.size != y.size || x.etag != y.etag) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view xml(reinterpret_cast<const char*>(data), size);
  (void)s3_xml::root(xml);
  (void)s3_xml::parse_error(xml);
  fuzz::accepts("parse_part_page", [&] { s3_xml::parse_part_page(xml); });
  fuzz::accepts("parse_upload_page", [&] { s3_xml::parse_upload_page(xml); });
  fuzz::accepts("parse_upload_id", [&] { s3_xml::parse_upload_id(xml); });
  fuzz::accepts("parse_delete_errors", [&] { s3_xml::parse_delete_errors(xml); });
  s3_xml::ObjectPage page;
  if (!fuzz::accepts("parse_object_page", [&] { page = s3_xml::parse_object_page(xml); })) {
    return 0;
  }
  const std::string written = page_xml(page);
  s3_xml::ObjectPage again;
  if (!fuzz::accepts("parse_object_page (rewritten)",
                     [&] { again = s3_xml::parse_object_page(written); }) ||
      !same(page, again)) {
    fuzz::fail("a ListBucketResult page does not read back the same once rewritten:\n" + written);
  }
  return 0;
}
