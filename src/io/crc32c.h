#pragma once
/// \file
/// CRC-32C (Castagnoli), the checksum S3 verifies on upload as `x-amz-checksum-crc32c`: with
/// SSE4.2's crc32 instruction where the CPU has it (about 8 GB/s per core, 15x OpenSSL's MD5
/// on the same core), a table otherwise.
///
/// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <string>

namespace tsnap::io {

/// CRC-32C of `n` bytes at `data`, continuing from `crc` (0 to start; the result of the bytes
/// before, to go on), as S3, iSCSI and ext4 compute it.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0) noexcept;

/// `crc` as S3's headers and XML carry it: the base64 of its 4 bytes, most significant first
/// ("mnG7TA==" for "hello").
std::string crc32c_base64(uint32_t crc);

}  // namespace tsnap::io
