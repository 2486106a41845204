#include "io/s3_xml.h"

#include <cctype>
#include <charconv>
#include <utility>

#include "tsnap/error.h"

namespace tsnap::io::s3_xml {
namespace {

[[noreturn]] void malformed(std::string_view what, const std::string& why) {
  throw_error(ErrorCode::kIo, "malformed " + std::string(what) + " answer: " + why);
}

// An element's text with its entities (named, &#N; and &#xN;) replaced, as UTF-8. An entity
// that is none of these stays as it is.
std::string decode(std::string_view s) {
  static const std::pair<std::string_view, char> kNamed[] = {
      {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    // Entities are short: a ';' further away than this ends none.
    const size_t semi = s[i] == '&' ? s.substr(i, 16).find(';') : std::string_view::npos;
    const std::string_view ent =
        semi == std::string_view::npos ? std::string_view() : s.substr(i + 1, semi - 1);
    uint32_t cp = 0;
    for (const auto& [name, c] : kNamed) {
      if (ent == name) cp = static_cast<unsigned char>(c);
    }
    if (ent.size() > 1 && ent[0] == '#') {
      const bool hx = ent[1] == 'x' || ent[1] == 'X';
      const std::string_view num = ent.substr(hx ? 2 : 1);
      const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), cp, hx ? 16 : 10);
      if (ec != std::errc{} || end != num.data() + num.size()) cp = 0;
    }
    if (cp == 0 || cp > 0x10FFFF) {
      r += s[i];
      continue;
    }
    if (cp < 0x80) {
      r += static_cast<char>(cp);
    } else {
      const int extra = cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;  // continuation bytes
      r += static_cast<char>(((0xFF00 >> (extra + 1)) & 0xFF) | (cp >> (6 * extra)));
      for (int k = extra - 1; k >= 0; --k) r += static_cast<char>(0x80 | ((cp >> (6 * k)) & 0x3F));
    }
    i += semi;
  }
  return r;
}

// The raw contents of each <tag ...>...</tag> (or "" for <tag/>) in `xml`, in order.
std::vector<std::string_view> elements(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> found;
  const std::string open = "<" + std::string(tag);
  const std::string close = "</" + std::string(tag) + ">";
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    const size_t after = pos + open.size();
    if (after >= xml.size()) break;
    const char c = xml[after];
    if (c != '>' && c != '/' && !std::isspace(static_cast<unsigned char>(c))) {
      pos = after;  // a longer name: <KeyMarker> is not <Key>
      continue;
    }
    const size_t gt = xml.find('>', after);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {
      found.emplace_back();
      pos = gt + 1;
      continue;
    }
    const size_t end = xml.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    found.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return found;
}

// The decoded text of the first <tag> in `xml`, "" when there is none.
std::string text(std::string_view xml, std::string_view tag) {
  const std::vector<std::string_view> all = elements(xml, tag);
  return all.empty() ? std::string() : decode(all.front());
}

// The contents of the root element, which must be `name` ("...Result", or "...Response" as
// some S3-compatible servers, moto among them, name a few) and closed.
std::string_view body(std::string_view xml, std::string_view name) {
  const std::string_view r = root(xml);
  const std::string_view stem = name.substr(0, name.size() - std::string_view("Result").size());
  const bool named =
      r == name || (r.size() == stem.size() + 8 && r.substr(0, stem.size()) == stem &&
                    r.substr(stem.size()) == "Response");
  if (!named) {
    malformed(name, r.empty() ? std::string("no XML element")
                              : "the root element is <" + std::string(r.substr(0, 64)) + ">");
  }
  const std::vector<std::string_view> all = elements(xml, r);
  if (all.empty()) malformed(name, "<" + std::string(r) + "> is not closed");
  return all.front();
}

std::string required(std::string_view xml, std::string_view tag, std::string_view what) {
  std::string v = text(xml, tag);
  if (v.empty()) malformed(what, "an entry without <" + std::string(tag) + ">");
  return v;
}

uint64_t number(std::string_view xml, std::string_view tag, std::string_view what) {
  const std::string s = text(xml, tag);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) {
    malformed(what, "<" + std::string(tag) + "> '" + s.substr(0, 64) + "' is not a number");
  }
  return v;
}

// Whether the page says more follow; then `next` (the name of the way there) must be given.
bool truncated(std::string_view page, std::string_view what) {
  const std::string t = text(page, "IsTruncated");
  if (t.empty() || t == "false") return false;
  if (t != "true") malformed(what, "<IsTruncated> is '" + t.substr(0, 64) + "'");
  return true;
}

std::string next(std::string_view page, bool more, std::string_view tag, std::string_view what) {
  if (!more) return {};
  std::string v = text(page, tag);
  if (v.empty()) malformed(what, "<IsTruncated> is true without <" + std::string(tag) + ">");
  return v;
}

}  // namespace

std::string_view root(std::string_view xml) {
  size_t pos = 0;
  while ((pos = xml.find('<', pos)) != std::string_view::npos) {
    if (pos + 1 < xml.size() && xml[pos + 1] != '?' && xml[pos + 1] != '!') {
      const size_t end = xml.find_first_of(" \t\r\n/>", pos + 1);
      return xml.substr(pos + 1, end == std::string_view::npos ? end : end - pos - 1);
    }
    ++pos;
  }
  return {};
}

ErrorBody parse_error(std::string_view xml) { return {text(xml, "Code"), text(xml, "Message")}; }

ObjectPage parse_object_page(std::string_view xml) {
  constexpr std::string_view kWhat = "ListBucketResult";
  const std::string_view page = body(xml, kWhat);
  ObjectPage p;
  for (std::string_view c : elements(page, "Contents")) {
    p.objects.push_back(
        {required(c, "Key", kWhat), number(c, "Size", kWhat), unquote_etag(text(c, "ETag"))});
  }
  for (std::string_view c : elements(page, "CommonPrefixes")) {
    p.prefixes.push_back(required(c, "Prefix", kWhat));
  }
  p.next_token = next(page, truncated(page, kWhat), "NextContinuationToken", kWhat);
  return p;
}

PartPage parse_part_page(std::string_view xml) {
  constexpr std::string_view kWhat = "ListPartsResult";
  const std::string_view page = body(xml, kWhat);
  PartPage p;
  for (std::string_view e : elements(page, "Part")) {
    const uint64_t n = number(e, "PartNumber", kWhat);
    if (n < 1 || n > 10000) malformed(kWhat, "part number " + std::to_string(n));
    p.parts.push_back({static_cast<int>(n), number(e, "Size", kWhat), unquote_etag(text(e, "ETag")),
                       text(e, "ChecksumCRC32C")});
  }
  p.next_marker = next(page, truncated(page, kWhat), "NextPartNumberMarker", kWhat);
  return p;
}

UploadPage parse_upload_page(std::string_view xml) {
  constexpr std::string_view kWhat = "ListMultipartUploadsResult";
  const std::string_view page = body(xml, kWhat);
  UploadPage p;
  for (std::string_view u : elements(page, "Upload")) {
    p.uploads.push_back(
        {required(u, "Key", kWhat), required(u, "UploadId", kWhat), text(u, "Initiated")});
  }
  const bool more = truncated(page, kWhat);
  p.next_key = next(page, more, "NextKeyMarker", kWhat);
  if (more) p.next_upload_id = text(page, "NextUploadIdMarker");
  return p;
}

std::string parse_upload_id(std::string_view xml) {
  constexpr std::string_view kWhat = "InitiateMultipartUploadResult";
  return required(body(xml, kWhat), "UploadId", kWhat);
}

std::vector<KeyError> parse_delete_errors(std::string_view xml) {
  constexpr std::string_view kWhat = "DeleteResult";
  std::vector<KeyError> errors;
  for (std::string_view e : elements(body(xml, kWhat), "Error")) {
    errors.push_back({required(e, "Key", kWhat), text(e, "Code"), text(e, "Message")});
  }
  return errors;
}

std::string unquote_etag(std::string etag) {
  while (!etag.empty() && std::isspace(static_cast<unsigned char>(etag.back()))) etag.pop_back();
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
    etag = etag.substr(1, etag.size() - 2);
  }
  return etag;
}

std::string escape(std::string_view text) {
  std::string r;
  r.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        r += "&amp;";
        break;
      case '<':
        r += "&lt;";
        break;
      case '>':
        r += "&gt;";
        break;
      default:
        r += c;
    }
  }
  return r;
}

}  // namespace tsnap::io::s3_xml
