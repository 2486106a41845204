#pragma once
// Helpers shared by the fuzz targets and their seed generator (tests/fuzz/README.md): the one
// oracle every target applies (only a tsnap::Error other than kInternal may come out of a parser
// or a public call), and the snapshot container, a whole snapshot directory in one input.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tsnap/error.h"

namespace tsnap::fuzz {

/// Prints `what` to stderr and aborts: libFuzzer then saves the input as a crash.
[[noreturn]] void fail(const std::string& what);

/// With TSNAP_FUZZ_VERBOSE set in the environment, prints what `what` threw (code and message) to
/// stderr: to see how a replayed input is rejected.
void rejected(const char* what, const Error& e);

/// Runs `call`. Returns true when it returned, false when it threw an expected tsnap::Error
/// (any code but kInternal). Aborts (fail) on kInternal or any other exception: a hostile file
/// must be rejected with a tsnap::Error naming the problem, never with another exception.
template <class Call>
bool accepts(const char* what, Call&& call) {
  try {
    std::forward<Call>(call)();
    return true;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInternal) fail(std::string(what) + ": kInternal: " + e.what());
    rejected(what, e);
    return false;
  } catch (const std::exception& e) {
    fail(std::string(what) + ": not a tsnap::Error: " + e.what());
  }
}

/// One file of a snapshot directory.
struct File {
  std::string name;
  std::string bytes;
};

/// The snapshot container: each file as its name, a NUL byte, its size as 4 bytes
/// little-endian, then its bytes.
std::string pack(const std::vector<File>& files);

/// Reads a container leniently (what a mutated input holds): a size past the end takes what is
/// left, reading stops at the first malformed record, and names that are not a plain file name
/// (empty, ".", "..", with '/', longer than 100 bytes) and files past the 8th are dropped.
std::vector<File> unpack(std::string_view input);

/// A directory of this process (under $TSNAP_FUZZ_TMPDIR, /dev/shm when writable, else $TMPDIR
/// or /tmp) that holds `files` and nothing else; each call empties it first.
std::string write_dir(const std::vector<File>& files);

}  // namespace tsnap::fuzz
