#pragma once
// TSNAP_HIDDEN marks the definition of a public class's private Impl (`struct TSNAP_HIDDEN
// Snapshotter::Impl {...}`): its members are not exported from libtsnap.so, although the class
// that holds it is (TSNAP_API). cmake/tsnap.map keeps everything else private.

#if defined(__GNUC__) || defined(__clang__)
#define TSNAP_HIDDEN __attribute__((visibility("hidden")))
#else
#define TSNAP_HIDDEN
#endif
