#pragma once
// The one check of caller input and on-disk data: TSNAP_CHECK(cond, code, message) throws
// throw_error(code, message) — the class derived from the code — when `cond` is false. The
// message expression is evaluated only then. (Invariants of tsnap itself use kInternal.)

#include "tsnap/error.h"

#define TSNAP_CHECK(cond, code, message)                  \
  do {                                                    \
    if (!(cond)) ::tsnap::throw_error((code), (message)); \
  } while (false)
