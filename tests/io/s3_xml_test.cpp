// The reader of S3's XML answers (io/s3_xml.h): the documents S3 and moto send, entities,
// ETag quotes, and the malformed pages that must be refused rather than cut a listing short.

#include "io/s3_xml.h"

#include <gtest/gtest.h>

#include <string>

#include "tsnap/error.h"

namespace tsnap::io::s3_xml {
namespace {

// The message of the IoError `f` throws ("" and a failure when it throws none).
template <typename F>
std::string malformed(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return {};
}

TEST(S3Xml, ListObjectsPage) {
  const ObjectPage p = parse_object_page(
      R"(<?xml version="1.0" encoding="UTF-8"?>)"
      R"(<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">)"
      "<Name>bkt</Name><Prefix>run/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>"
      "<IsTruncated>true</IsTruncated><NextContinuationToken>tok&amp;1</NextContinuationToken>"
      "<Contents><Key>run/a&lt;b&gt;&#233;&#x1F600;</Key><LastModified>x</LastModified>"
      "<ETag>&quot;0123abcd&quot;</ETag><Size>42</Size></Contents>"
      "<Contents><Key>run/KeyMarker</Key><Size>0</Size><ETag>\"e-3\"</ETag></Contents>"
      "<CommonPrefixes><Prefix>run/step-1/</Prefix></CommonPrefixes>"
      "<CommonPrefixes><Prefix>run/step-2/</Prefix></CommonPrefixes>"
      "</ListBucketResult>");
  ASSERT_EQ(p.objects.size(), 2u);
  EXPECT_EQ(p.objects[0].key, "run/a<b>\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(p.objects[0].size, 42u);
  EXPECT_EQ(p.objects[0].etag, "0123abcd");
  EXPECT_EQ(p.objects[1].key, "run/KeyMarker");
  EXPECT_EQ(p.objects[1].etag, "e-3");
  EXPECT_EQ(p.prefixes, (std::vector<std::string>{"run/step-1/", "run/step-2/"}));
  EXPECT_EQ(p.next_token, "tok&1");

  const ObjectPage last = parse_object_page(
      "<ListBucketResult><IsTruncated>false</IsTruncated><NextContinuationToken>ignored"
      "</NextContinuationToken></ListBucketResult>");
  EXPECT_TRUE(last.objects.empty());
  EXPECT_EQ(last.next_token, "");
  EXPECT_EQ(parse_object_page("<ListBucketResult/>").next_token, "");
}

TEST(S3Xml, MalformedListingsAreRefused) {
  for (const char* doc : {
           "",
           "not xml",
           "<Error><Code>InternalError</Code></Error>",
           "<ListBucketResult><Contents><Key>a</Key><Size>1</Size></Contents>",  // not closed
           "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>a</Key></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>a</Key><Size>-1</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>a</Key><Size>1x</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>a</Key><Size>99999999999999999999</Size></Contents>"
           "</ListBucketResult>",
           "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
           "<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>",
           "<ListBucketResult><CommonPrefixes></CommonPrefixes></ListBucketResult>",
       }) {
    const std::string what = malformed([&] { parse_object_page(doc); });
    EXPECT_NE(what.find("malformed ListBucketResult answer"), std::string::npos) << doc << what;
  }
  EXPECT_NE(malformed([] { parse_object_page("<Error/>"); }).find("root element is <Error>"),
            std::string::npos);
}

TEST(S3Xml, PartsUploadsInitiateAndDelete) {
  const PartPage parts = parse_part_page(
      "<ListPartsResult><IsTruncated>true</IsTruncated>"
      "<NextPartNumberMarker>2</NextPartNumberMarker>"
      "<Part><PartNumber>1</PartNumber><ETag>\"aa\"</ETag><Size>8388608</Size></Part>"
      "<Part><PartNumber>2</PartNumber><ETag>\"bb\"</ETag><Size>5</Size></Part>"
      "</ListPartsResult>");
  ASSERT_EQ(parts.parts.size(), 2u);
  EXPECT_EQ(parts.parts[1].number, 2);
  EXPECT_EQ(parts.parts[0].size, 8388608u);
  EXPECT_EQ(parts.parts[0].etag, "aa");
  EXPECT_EQ(parts.next_marker, "2");
  // moto names this root ListPartsResponse.
  EXPECT_EQ(parse_part_page("<ListPartsResponse><Part><PartNumber>3</PartNumber><Size>1</Size>"
                            "</Part></ListPartsResponse>")
                .parts.at(0)
                .number,
            3);
  malformed([] { parse_part_page("<ListPartsResult><Part></Part></ListPartsResponse>"); });
  malformed([] {
    parse_part_page(
        "<ListPartsResult><Part><PartNumber>0</PartNumber><Size>1</Size></Part>"
        "</ListPartsResult>");
  });

  const UploadPage uploads = parse_upload_page(
      "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>"
      "<NextKeyMarker>k2</NextKeyMarker><NextUploadIdMarker>u2</NextUploadIdMarker>"
      "<Upload><Key>k1</Key><UploadId>u1</UploadId><Initiated>2024-01-01T00:00:00Z</Initiated>"
      "</Upload></ListMultipartUploadsResult>");
  ASSERT_EQ(uploads.uploads.size(), 1u);
  EXPECT_EQ(uploads.uploads[0].upload_id, "u1");
  EXPECT_EQ(uploads.uploads[0].initiated, "2024-01-01T00:00:00Z");
  EXPECT_EQ(uploads.next_key, "k2");
  EXPECT_EQ(uploads.next_upload_id, "u2");
  malformed([] {
    parse_upload_page(
        "<ListMultipartUploadsResult><Upload><Key>k</Key></Upload>"
        "</ListMultipartUploadsResult>");
  });

  EXPECT_EQ(parse_upload_id("<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>"
                            "<UploadId>abc</UploadId></InitiateMultipartUploadResult>"),
            "abc");
  malformed([] { parse_upload_id("<InitiateMultipartUploadResult/>"); });

  EXPECT_TRUE(parse_delete_errors("<DeleteResult></DeleteResult>").empty());
  const std::vector<KeyError> errors = parse_delete_errors(
      "<DeleteResult><Deleted><Key>a</Key></Deleted><Error><Key>b</Key><Code>AccessDenied</Code>"
      "<Message>no</Message></Error></DeleteResult>");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "b");
  EXPECT_EQ(errors[0].code, "AccessDenied");
  EXPECT_EQ(errors[0].message, "no");
}

TEST(S3Xml, ErrorBodiesAreReadLeniently) {
  const ErrorBody e = parse_error(
      "<?xml version=\"1.0\"?><Error><Code>ExpiredToken</Code>"
      "<Message>The provided token has expired.</Message><RequestId>1</RequestId></Error>");
  EXPECT_EQ(e.code, "ExpiredToken");
  EXPECT_EQ(e.message, "The provided token has expired.");
  EXPECT_EQ(root("<?xml version=\"1.0\"?>\n<!-- c --><Error>"), "Error");
  for (const char* garbage : {"", "<Error><Code>Unclosed", "\xff\xfe<<<>>>&&&;;", "<html>502"}) {
    const ErrorBody g = parse_error(garbage);
    EXPECT_EQ(g.code, "") << garbage;
  }
}

TEST(S3Xml, EscapeAndEntitiesRoundTrip) {
  const std::string key = "a&b<c>d\"e'f &amp; &#0; &#x110000; &bogus; &";
  const ObjectPage p = parse_object_page("<ListBucketResult><Contents><Key>" + escape(key) +
                                         "</Key><Size>1</Size></Contents></ListBucketResult>");
  ASSERT_EQ(p.objects.size(), 1u);
  EXPECT_EQ(p.objects[0].key, key);
  EXPECT_EQ(unquote_etag("\"abc\" \n"), "abc");
  EXPECT_EQ(unquote_etag("abc"), "abc");
  EXPECT_EQ(unquote_etag("\""), "\"");
}

}  // namespace
}  // namespace tsnap::io::s3_xml
