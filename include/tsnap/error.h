#pragma once
/// \file
/// The errors tsnap throws. Every public call reports bad input and failed I/O by throwing a
/// `tsnap::Error` (or a subclass) whose message names the key, file, offset or errno involved.
/// Background failures never escape a thread: they complete the handle and `wait()` rethrows them.

#include <exception>
#include <stdexcept>
#include <string>

#include "tsnap/export.h"

namespace tsnap {

/// What went wrong, one value per distinct failure, so callers and tests can branch on it.
enum class ErrorCode {
  kInvalidArgument,    ///< Caller error: bad option, bad key pattern, unsupported dtype.
  kKeyNotFound,        ///< A requested key is not in the state or snapshot.
  kShapeMismatch,      ///< A tensor's shape or dtype does not match its destination.
  kAlreadyExists,      ///< A snapshot with that name exists and overwrite was not asked for.
  kNotFound,           ///< A snapshot, manifest or shard file is missing.
  kIo,                 ///< A system call failed (errno is in the message and in `sys_errno()`).
  kNoSpace,            ///< The disk is full (ENOSPC / EDQUOT).
  kBadHeader,          ///< A safetensors header is malformed (length, JSON, fields).
  kHeaderTooLarge,     ///< A safetensors header length exceeds the cap.
  kBadOffsets,         ///< Tensor byte ranges overlap, leave holes or lie outside the file.
  kBadManifest,        ///< MANIFEST.json is malformed or inconsistent with the shards.
  kUnsupportedFormat,  ///< The snapshot was written by an unknown (newer) format version.
  kUnsafePath,         ///< A file name in the manifest leaves the snapshot directory.
  kTruncated,          ///< A shard is shorter than the manifest says.
  kHashMismatch,       ///< A chunk's XXH3-64 does not match the manifest.
  kBusy,               ///< A save is still in flight and the policy says fail fast.
  kCancelled,          ///< The operation was cancelled (e.g. the owner shut down).
  kUnsupported,        ///< The object is of a kind tsnap does not handle (e.g. an optimizer).
  kPeerFailed,         ///< Another rank of a distributed save failed, disagreed or fell silent.
  kInternal,           ///< An invariant was violated: a bug in tsnap.
  kStale,              ///< A save's state did not change where training changes it (StaleCheck).
};

/// Short stable name of a code ("hash_mismatch"), for logs and the CLI.
TSNAP_API const char* to_string(ErrorCode code) noexcept;

/// The exception class a code is thrown as; every throw in tsnap derives it from the code, so a
/// code always comes with the same class:
///
/// | class             | codes                                                                |
/// |-------------------|----------------------------------------------------------------------|
/// | `InvalidArgument` | kInvalidArgument, kKeyNotFound, kShapeMismatch                       |
/// | `IoError`         | kIo, kNoSpace, kNotFound (`sys_errno()` is ENOENT where a call failed) |
/// | `FormatError`     | kBadHeader, kHeaderTooLarge, kBadOffsets, kBadManifest,              |
/// |                   | kUnsupportedFormat, kUnsafePath, kTruncated, kHashMismatch           |
/// | `Error`           | kAlreadyExists, kBusy, kCancelled, kUnsupported, kPeerFailed,        |
/// |                   | kInternal, kStale                                                    |
enum class ErrorClass { kError, kIoError, kFormatError, kInvalidArgument };

/// The class of `code` (the table above).
constexpr ErrorClass error_class(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kKeyNotFound:
    case ErrorCode::kShapeMismatch:
      return ErrorClass::kInvalidArgument;
    case ErrorCode::kIo:
    case ErrorCode::kNoSpace:
    case ErrorCode::kNotFound:
      return ErrorClass::kIoError;
    case ErrorCode::kBadHeader:
    case ErrorCode::kHeaderTooLarge:
    case ErrorCode::kBadOffsets:
    case ErrorCode::kBadManifest:
    case ErrorCode::kUnsupportedFormat:
    case ErrorCode::kUnsafePath:
    case ErrorCode::kTruncated:
    case ErrorCode::kHashMismatch:
      return ErrorClass::kFormatError;
    default:
      return ErrorClass::kError;
  }
}

/// Base of every exception tsnap throws.
/// Thread-safety: immutable after construction. Ownership: a value type.
class TSNAP_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, int sys_errno = 0)
      : std::runtime_error(message), code_(code), sys_errno_(sys_errno) {}
  /// The kind of failure.
  ErrorCode code() const noexcept { return code_; }
  /// The errno of a failed system call, 0 when none was involved.
  int sys_errno() const noexcept { return sys_errno_; }

 private:
  ErrorCode code_;
  int sys_errno_;
};

/// A failed system call; the message names the call, file and offset; `sys_errno()` is set.
class TSNAP_API IoError : public Error {
 public:
  using Error::Error;
};

/// A snapshot on disk is malformed, truncated or corrupt (header, manifest, offsets, hashes).
class TSNAP_API FormatError : public Error {
 public:
  using Error::Error;
};

/// The caller passed something tsnap cannot use (bad option, unknown key, wrong shape).
class TSNAP_API InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// The exception of `code`'s class (see error_class) carrying `message` and `sys_errno`.
/// Thread-safety: thread-safe. Ownership: the caller owns the returned exception.
TSNAP_API std::exception_ptr make_error(ErrorCode code, const std::string& message,
                                        int sys_errno = 0);

/// Throws make_error(code, message, sys_errno): the one way tsnap throws.
[[noreturn]] TSNAP_API void throw_error(ErrorCode code, const std::string& message,
                                        int sys_errno = 0);

}  // namespace tsnap
