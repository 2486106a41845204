#!/usr/bin/env python3
"""An independent, minimal safetensors reader, written from the published specification
(https://github.com/huggingface/safetensors#format), in plain Python 3 (stdlib only).

It checks that a tsnap shard is a valid safetensors file for any other reader:
  * 8-byte little-endian unsigned length N, then N bytes of UTF-8 JSON (trailing spaces allowed);
  * the JSON is an object; "__metadata__", when present, maps strings to strings;
  * every other entry is {"dtype": str, "shape": [int >= 0, ...], "data_offsets": [begin, end]};
  * end - begin == product(shape) * size(dtype), and the ranges, sorted, tile the data section
    [0, file_size - 8 - N) exactly: no overlap, no hole.
With --tsnap it also checks the rules of tsnap format v1 (docs/format.md): data starts at a
multiple of 4096, the padding is spaces only, tensors are ordered by element size (largest
first) then name, and every tensor is aligned to its element size.

Usage:
  python3 safetensors_reader.py [--tsnap] FILE
Prints one JSON line per tensor, in data order:
  {"name": ..., "dtype": ..., "shape": [...], "begin": ..., "end": ...,
   "byte_sum": <sum of the raw bytes>, "first": [<up to 4 first values>]}
then "OK <count> tensors". Exits 0 when the file is valid, 1 (with the reason on stderr) when not.

A C++ test runs it on a file it wrote and compares the printed lines with the tensors it saved
(see run_reference_reader in tests/format/safetensors_test.cpp).
"""

import json
import struct
import sys

MAX_HEADER = 100 << 20  # tsnap's cap (the reference implementation's too)
ALIGNMENT = 4096

# dtype -> (element size, struct format or None)
DTYPES = {
    "F64": (8, "<d"),
    "F32": (4, "<f"),
    "F16": (2, "<e"),
    "BF16": (2, None),  # decoded by hand: the top half of an F32
    "I64": (8, "<q"),
    "I32": (4, "<i"),
    "I16": (2, "<h"),
    "I8": (1, "<b"),
    "U8": (1, "<B"),
    "BOOL": (1, "<?"),
}


class Invalid(Exception):
    pass


def no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise Invalid("duplicate JSON key %r" % key)
        out[key] = value
    return out


def is_uint(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def decode(dtype, raw):
    size, fmt = DTYPES[dtype]
    if dtype == "BF16":
        return struct.unpack("<f", b"\0\0" + raw)[0]
    return struct.unpack(fmt, raw)[0]


def printable(x):
    """JSON has no NaN or infinity: print those as strings."""
    return x if not isinstance(x, float) or x - x == 0 else repr(x)


def read(path, tsnap):
    with open(path, "rb") as f:
        f.seek(0, 2)
        file_size = f.tell()
        f.seek(0)
        if file_size < 8:
            raise Invalid("file has %d bytes, fewer than the 8-byte header length" % file_size)
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER:
            raise Invalid("header length %d exceeds %d" % (n, MAX_HEADER))
        if 8 + n > file_size:
            raise Invalid("header length %d runs past the end of the %d-byte file" % (n, file_size))
        raw = f.read(n)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Invalid("header is not UTF-8: %s" % e)
        if not text.startswith("{"):
            raise Invalid("header does not start with '{'")
        try:
            header = json.loads(text, object_pairs_hook=no_duplicates)
        except ValueError as e:
            raise Invalid("header is not JSON: %s" % e)
        if not isinstance(header, dict):
            raise Invalid("header is not a JSON object")
        if tsnap:
            if (8 + n) % ALIGNMENT:
                raise Invalid("data starts at %d, not a multiple of %d" % (8 + n, ALIGNMENT))
            stripped = text.rstrip(" ")
            if not stripped.endswith("}") or stripped != text.strip():
                raise Invalid("header padding is not spaces only")

        meta = header.pop("__metadata__", {})
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise Invalid("__metadata__ is not a map of strings to strings")

        data_len = file_size - 8 - n
        tensors = []
        for name, info in header.items():
            if not isinstance(info, dict):
                raise Invalid("tensor %r: entry is not an object" % name)
            dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
            if dtype not in DTYPES:
                raise Invalid("tensor %r: unknown dtype %r" % (name, dtype))
            if not isinstance(shape, list) or not all(is_uint(d) for d in shape):
                raise Invalid("tensor %r: bad shape %r" % (name, shape))
            if (not isinstance(offsets, list) or len(offsets) != 2
                    or not all(is_uint(o) for o in offsets)):
                raise Invalid("tensor %r: bad data_offsets %r" % (name, offsets))
            begin, end = offsets
            numel = 1
            for d in shape:
                numel *= d
            if not begin <= end <= data_len:
                raise Invalid("tensor %r: data_offsets %r outside the %d data bytes"
                              % (name, offsets, data_len))
            if end - begin != numel * DTYPES[dtype][0]:
                raise Invalid("tensor %r: %s %r needs %d bytes, data_offsets give %d"
                              % (name, dtype, shape, numel * DTYPES[dtype][0], end - begin))
            tensors.append((begin, end, name, dtype, shape))

        tensors.sort()
        expected = 0
        for begin, end, name, _, _ in tensors:
            if begin != expected:
                raise Invalid("tensor %r starts at %d, expected %d (%s)"
                              % (name, begin, expected, "overlap" if begin < expected else "hole"))
            expected = end
        if expected != data_len:
            raise Invalid("data section has %d bytes, tensors cover %d" % (data_len, expected))

        if tsnap:
            expected = 0
            for begin, end, name, _, _ in sorted(tensors, key=lambda t: (-DTYPES[t[3]][0], t[2])):
                if begin != expected:
                    raise Invalid("tensor %r is not where ordering by element size, then name, "
                                  "puts it" % name)
                expected = end
            for begin, _, name, dtype, _ in tensors:
                if (8 + n + begin) % DTYPES[dtype][0]:
                    raise Invalid("tensor %r is not aligned to its element size" % name)

        for begin, end, name, dtype, shape in tensors:
            f.seek(8 + n + begin)
            left, byte_sum, first = end - begin, 0, b""
            while left:
                block = f.read(min(left, 1 << 20))
                if not block:
                    raise Invalid("file ended inside tensor %r" % name)
                if len(first) < 64:
                    first += block[:64]
                byte_sum += sum(block)
                left -= len(block)
            size = DTYPES[dtype][0]
            values = [printable(decode(dtype, first[i:i + size]))
                      for i in range(0, min(len(first), 4 * size), size)]
            print(json.dumps({"name": name, "dtype": dtype, "shape": shape, "begin": begin,
                              "end": end, "byte_sum": byte_sum, "first": values}))
        print("OK %d tensors" % len(tensors))


def main(argv):
    args = argv[1:]
    tsnap = "--tsnap" in args
    files = [a for a in args if a != "--tsnap"]
    if len(files) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        read(files[0], tsnap)
    except Invalid as e:
        print("%s: invalid safetensors file: %s" % (files[0], e), file=sys.stderr)
        return 1
    except OSError as e:
        print("%s: %s" % (files[0], e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
