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
  static const std::vector<ErrorCode> codes = {
      ErrorCode::kInvalidArgument, ErrorCode::kKeyNotFound,
      ErrorCode::kShapeMismatch,   ErrorCode::kAlreadyExists,
      ErrorCode::kNotFound,        ErrorCode::kIo,
      ErrorCode::kNoSpace,         ErrorCode::kBadHeader,
      ErrorCode::kHeaderTooLarge,  ErrorCode::kBadOffsets,
      ErrorCode::kBadManifest,     ErrorCode::kUnsupportedFormat,
      ErrorCode::kUnsafePath,      ErrorCode::kTruncated,
      ErrorCode::kHashMismatch,    ErrorCode::kBusy,
      ErrorCode::kCancelled,       ErrorCode::kUnsupported,
      ErrorCode::kPeerFailed,      ErrorCode::kInternal};
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
