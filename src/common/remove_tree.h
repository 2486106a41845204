#pragma once
// Recursive removal of a directory tree with nftw(3), not std::filesystem::remove_all: the
// LibTorch wheels of PyTorch export their own std::filesystem symbols from libtorch.so, and a
// process linked against them can bind remove_all to a copy that crashes (seen with torch 2.11).

#include <string>

namespace tsnap::detail {

/// Removes `path` and everything below it (does not follow symbolic links). Returns 0, or
/// -errno of the first failure; a missing `path` is success. Never throws.
int remove_tree(const std::string& path) noexcept;

}  // namespace tsnap::detail
