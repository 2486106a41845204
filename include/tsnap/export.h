#pragma once
/// \file
/// `TSNAP_API` marks what `libtsnap.so` exports: the public API declared in `include/tsnap/`.
/// The library is built with hidden visibility, so everything else (the internals under `src/`)
/// stays private to it; tsnap's own tests and tools link the same objects statically.

#if defined(__GNUC__) || defined(__clang__)
#define TSNAP_API __attribute__((visibility("default")))
#else
#define TSNAP_API
#endif
