"""The one way the Python code makes a ``tsnap.Error``: ``raise error("invalid_argument", ...)``.

The class follows from the code, as in C++ (``tsnap::error_class``, include/tsnap/error.h), and
the exception carries ``code`` and ``errno`` (0: no system call failed in Python) like those
the engine raises.
"""

from __future__ import annotations

from typing import Literal

from . import _C

ErrorCode = Literal[
    "invalid_argument", "key_not_found", "shape_mismatch", "already_exists", "not_found", "io",
    "no_space", "bad_header", "header_too_large", "bad_offsets", "bad_manifest",
    "unsupported_format", "unsafe_path", "truncated", "hash_mismatch", "busy", "cancelled",
    "unsupported", "peer_failed", "internal", "stale",
]

_CLASSES: dict[str, type[_C.Error]] = {
    "invalid_argument": _C.InvalidArgument, "key_not_found": _C.InvalidArgument,
    "shape_mismatch": _C.InvalidArgument,
    "io": _C.IoError, "no_space": _C.IoError, "not_found": _C.IoError,
    "bad_header": _C.FormatError, "header_too_large": _C.FormatError,
    "bad_offsets": _C.FormatError, "bad_manifest": _C.FormatError,
    "unsupported_format": _C.FormatError, "unsafe_path": _C.FormatError,
    "truncated": _C.FormatError, "hash_mismatch": _C.FormatError,
    "already_exists": _C.Error, "busy": _C.Error, "cancelled": _C.Error,
    "unsupported": _C.Error, "peer_failed": _C.Error, "internal": _C.Error, "stale": _C.Error,
}


def error(code: ErrorCode, message: str) -> _C.Error:
    """The exception of ``code``'s class with ``message``, ``.code`` and ``.errno`` set; raise
    it. An unknown code is a bug in tsnap: ValueError."""
    cls = _CLASSES.get(code)
    if cls is None:
        raise ValueError(f"tsnap: unknown error code {code!r}")
    e = cls(message)
    e.code = code
    e.errno = 0
    return e
