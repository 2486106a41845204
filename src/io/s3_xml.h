#pragma once
/// \file
/// The XML documents S3 answers with, read into plain values: ListObjectsV2, ListParts and
/// ListMultipartUploads pages, InitiateMultipartUpload's upload id, DeleteObjects' per-key
/// errors, and the `<Error>` document of a failed request.
///
/// The reader is small on purpose: S3's documents are flat (an element asked for never nests
/// in itself), so each field is the text of the first `<Name>...</Name>` inside its parent,
/// with the five named entities and numeric character references decoded. There is no DTD, no
/// external entity and no recursion; time and memory are linear in the input, whose size the
/// client caps before it gets here (kMaxXmlBytes).
///
/// A document that is not what the request expects (another root element, a root that is never
/// closed, an entry without its key, a number that is not one, a page that says it is truncated
/// but gives no way to the next) is an IoError (kIo) whose message says what is wrong; the
/// client prefixes the operation and object. Error documents are read leniently: whatever
/// `<Code>` and `<Message>` there are, or empty strings.
/// Thread-safety: every function is pure.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tsnap::io {

/// The largest answer document the client reads (a listing page of 1000 keys of 1 KiB each,
/// with their ETags and sizes, is about 1.3 MiB).
inline constexpr size_t kMaxXmlBytes = 8u << 20;

/// One part of a multipart upload.
struct S3Part {
  int number = 0;     ///< 1..10000.
  uint64_t size = 0;  ///< Bytes (from ListParts; unused by complete_multipart_upload).
  std::string etag;   ///< Without quotes.
  /// The part's CRC-32C in base64 (S3Checksum::kCrc32c uploads; ListParts' ChecksumCRC32C),
  /// sent back with CompleteMultipartUpload; empty: none.
  std::string crc32c;
};

/// A multipart upload in progress (ListMultipartUploads).
struct S3Upload {
  std::string key;
  std::string upload_id;
  std::string initiated;  ///< ISO 8601 time, as S3 gives it.
};

/// An object (ListObjectsV2, HeadObject).
struct S3Object {
  std::string key;
  uint64_t size = 0;
  std::string etag;  ///< Without quotes; "<md5>-<parts>" for a multipart object.
};

namespace s3_xml {

/// S3's error document: `<Error><Code>NoSuchKey</Code><Message>...</Message></Error>`.
struct ErrorBody {
  std::string code;     ///< Empty when the document has none.
  std::string message;  ///< Empty when the document has none.
};

/// One ListObjectsV2 page (`ListBucketResult`).
struct ObjectPage {
  std::vector<S3Object> objects;      ///< `Contents`, in the order given.
  std::vector<std::string> prefixes;  ///< `CommonPrefixes/Prefix`, in the order given.
  std::string next_token;             ///< Empty on the last page.
};

/// One ListParts page (`ListPartsResult`).
struct PartPage {
  std::vector<S3Part> parts;
  std::string next_marker;  ///< Empty on the last page.
};

/// One ListMultipartUploads page (`ListMultipartUploadsResult`).
struct UploadPage {
  std::vector<S3Upload> uploads;
  std::string next_key;        ///< Empty on the last page.
  std::string next_upload_id;  ///< May be empty on a page that is not the last.
};

/// A key DeleteObjects could not delete (`DeleteResult/Error`).
struct KeyError {
  std::string key, code, message;
};

/// The name of the document's root element ("" when it has none).
std::string_view root(std::string_view xml);

/// The code and message of an error document (of any root; empty fields when absent).
ErrorBody parse_error(std::string_view xml);
/// Errors (all of them below): IoError(kIo) for a document that is not the page asked for.
ObjectPage parse_object_page(std::string_view xml);
PartPage parse_part_page(std::string_view xml);
UploadPage parse_upload_page(std::string_view xml);
/// The UploadId of an InitiateMultipartUploadResult (never empty).
std::string parse_upload_id(std::string_view xml);
/// The keys a DeleteResult reports as not deleted (empty when all were).
std::vector<KeyError> parse_delete_errors(std::string_view xml);

/// An ETag without the quotes S3 puts around it (in XML and in the ETag header), nor trailing
/// white space.
std::string unquote_etag(std::string etag);

/// `text` as element content: & < > escaped (for request bodies).
std::string escape(std::string_view text);

}  // namespace s3_xml
}  // namespace tsnap::io
