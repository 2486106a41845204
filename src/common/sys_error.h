#pragma once
// Converting -errno results of the I/O layer into tsnap errors, and errors into messages, in
// one place.

#include <exception>
#include <string>

namespace tsnap::detail {

/// An IoError (kNoSpace for ENOSPC/EDQUOT, else kIo) for `-neg_errno` while doing `what`,
/// e.g. "write shard-00000-of-00001.safetensors at offset 4096".
std::exception_ptr sys_error(int neg_errno, const std::string& what);
/// Throws it.
[[noreturn]] void throw_sys_error(int neg_errno, const std::string& what);

/// The message of a captured exception (what() of a std::exception, else "unknown error"),
/// for records and logs that keep errors as text.
std::string message_of(const std::exception_ptr& e);

/// The first line of `message`: LibTorch's errors (c10::Error) append a C++ backtrace to their
/// message, which logs and tsnap's own messages leave out.
std::string first_line(const std::string& message);

}  // namespace tsnap::detail
