// The error model: each code is thrown as the class the public table gives it, by every path
// (throw_error, make_error, the -errno conversion).

#include "tsnap/error.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <vector>

#include "common/sys_error.h"

namespace tsnap {
namespace {

const std::vector<ErrorCode>& all_codes() {
  static const std::vector<ErrorCode> codes = {ErrorCode::kInvalidArgument,
                                               ErrorCode::kKeyNotFound,
                                               ErrorCode::kShapeMismatch,
                                               ErrorCode::kAlreadyExists,
                                               ErrorCode::kNotFound,
                                               ErrorCode::kIo,
                                               ErrorCode::kNoSpace,
                                               ErrorCode::kBadHeader,
                                               ErrorCode::kHeaderTooLarge,
                                               ErrorCode::kBadOffsets,
                                               ErrorCode::kBadManifest,
                                               ErrorCode::kUnsupportedFormat,
                                               ErrorCode::kUnsafePath,
                                               ErrorCode::kTruncated,
                                               ErrorCode::kHashMismatch,
                                               ErrorCode::kBusy,
                                               ErrorCode::kCancelled,
                                               ErrorCode::kUnsupported,
                                               ErrorCode::kPeerFailed,
                                               ErrorCode::kInternal,
                                               ErrorCode::kStale};
  return codes;
}

// The class an exception was thrown as, told apart by catching the most derived first.
ErrorClass thrown_class(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const InvalidArgument&) {
    return ErrorClass::kInvalidArgument;
  } catch (const IoError&) {
    return ErrorClass::kIoError;
  } catch (const FormatError&) {
    return ErrorClass::kFormatError;
  } catch (const Error&) {
    return ErrorClass::kError;
  }
}

TEST(ErrorModel, EveryCodeIsThrownAsItsClassWithMessageAndErrno) {
  for (ErrorCode code : all_codes()) {
    SCOPED_TRACE(to_string(code));
    EXPECT_EQ(thrown_class(make_error(code, "m", 5)), error_class(code));
    try {
      throw_error(code, "what went wrong", 7);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_STREQ(e.what(), "what went wrong");
      EXPECT_EQ(e.sys_errno(), 7);
      EXPECT_EQ(thrown_class(std::current_exception()), error_class(code));
    }
  }
}

// Messages quote keys, names and file contents of any length and bytes: each stays valid
// UTF-8 (a Python binding or a JSON log can take it) and is capped, its middle cut.
TEST(ErrorModel, MessagesAreValidUtf8AndCapped) {
  const std::string huge(100 << 20, 'k');
  try {
    throw_error(ErrorCode::kBadManifest, "key '" + huge + "' is named twice");
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_LT(what.size(), 5000u);
    EXPECT_EQ(what.rfind("key 'kkk", 0), 0u);
    EXPECT_NE(what.find("bytes cut"), std::string::npos);
    EXPECT_NE(what.find("' is named twice"), std::string::npos) << "the end is kept";
  }
  // Invalid sequences become \xHH; valid multi-byte characters stay.
  const std::string bytes = std::string("caf\xc3\xa9 \xff\xfe x\xe2\x82") + "";
  try {
    throw_error(ErrorCode::kBadManifest, bytes);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "caf\xc3\xa9 \\xff\\xfe x\\xe2\\x82");
  }
}

TEST(ErrorModel, TheTableGroupsCodesByWhoseFaultItIs) {
  EXPECT_EQ(error_class(ErrorCode::kKeyNotFound), ErrorClass::kInvalidArgument);
  EXPECT_EQ(error_class(ErrorCode::kShapeMismatch), ErrorClass::kInvalidArgument);
  EXPECT_EQ(error_class(ErrorCode::kNotFound), ErrorClass::kIoError);
  EXPECT_EQ(error_class(ErrorCode::kNoSpace), ErrorClass::kIoError);
  EXPECT_EQ(error_class(ErrorCode::kHashMismatch), ErrorClass::kFormatError);
  EXPECT_EQ(error_class(ErrorCode::kUnsafePath), ErrorClass::kFormatError);
  EXPECT_EQ(error_class(ErrorCode::kBusy), ErrorClass::kError);
  EXPECT_EQ(error_class(ErrorCode::kInternal), ErrorClass::kError);
}

TEST(ErrorModel, ErrnoConversionNamesTheCallAndSeparatesAFullDisk) {
  try {
    detail::throw_sys_error(-ENOSPC, "write shard at offset 4096");
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
    EXPECT_EQ(e.sys_errno(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find("write shard at offset 4096"), std::string::npos);
  }
  EXPECT_EQ(thrown_class(detail::sys_error(-EIO, "fsync")), ErrorClass::kIoError);
}

}  // namespace
}  // namespace tsnap
