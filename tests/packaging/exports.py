#!/usr/bin/env python3
"""Fails when libtsnap.so exports anything but tsnap's public API (cmake/tsnap.map).

Every defined dynamic symbol must be a member of namespace `tsnap` (or its typeinfo or vtable)
that the public headers declare: nothing of the private namespaces (tsnap::detail, ::io,
::format, ::plan, ::stage, ::pipeline, ::restore, ::policy, ::state), no member of a private
`Impl`, and nothing of Boost or the standard library.

Usage: exports.py LIBRARY      checks the library (nm -DC --defined-only)
       exports.py --self-test  checks that planted violations are reported
"""
import re
import subprocess
import sys

PREFIXES = ("tsnap::", "typeinfo for tsnap::", "typeinfo name for tsnap::", "vtable for tsnap::")
PRIVATE = re.compile(r"^(typeinfo for |typeinfo name for |vtable for )?tsnap::"
                     r"((detail|io|format|plan|stage|pipeline|restore|policy|state|dist)::"
                     r"|.*::Impl::)")


def problems(symbols):
    out = []
    for name in symbols:
        name = name.split("@")[0]
        if not name.startswith(PREFIXES):
            out.append(f"not tsnap's public API: {name}")
        elif PRIVATE.match(name):
            out.append(f"a private symbol: {name}")
    return out


def exported(library):
    text = subprocess.run(["nm", "-DC", "--defined-only", library], check=True,
                          capture_output=True, text=True).stdout
    symbols = []
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] != "A":  # "A": the version node's name
            symbols.append(parts[2])
    return symbols


def main():
    if sys.argv[1:] == ["--self-test"]:
        planted = ["tsnap::Snapshotter::Impl::start()",
                   "boost::system::error_category::failed(int) const",
                   "tsnap::pipeline::Drain::wait()", "typeinfo for tsnap::detail::X"]
        good = ["tsnap::load(std::filesystem::path const&)", "typeinfo for tsnap::Error",
                "tsnap::throw_error(tsnap::ErrorCode, std::string const&, int)",
                "vtable for tsnap::IoError", "tsnap::Snapshotter::save_async(int)@@TSNAP_0"]
        found = problems(planted + good)
        if len(found) != len(planted):
            print("exports self-test: expected", len(planted), "problems, got:", *found, sep="\n")
            return 1
        print("exports self-test: every planted symbol reported")
        return 0
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    symbols = exported(sys.argv[1])
    found = problems(symbols)
    for p in found:
        print(p)
    if not found:
        print(f"{sys.argv[1]}: {len(symbols)} symbols, all public tsnap API")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
