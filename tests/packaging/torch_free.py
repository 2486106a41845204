#!/usr/bin/env python3
"""Checks that a program loads no LibTorch library: neither it nor any library it loads (as
the dynamic loader resolves them, through ldd) is libtorch*, libc10* or a CUDA library. The
`tsnap` tool's read-only commands must start without them; `tsnap-torch` holds the rest.

  torch_free.py PROGRAM        exit 0 when clean, 1 naming what it loads
  torch_free.py --self-test    proves the check reports a program that does load LibTorch
"""
import re
import subprocess
import sys

FORBIDDEN = re.compile(r"^(libtorch|libc10|libcuda|libcudart|libcublas|libcudnn|libnccl|libnvshmem)")


def loaded(program):
    out = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    names = []
    for line in out.splitlines():
        name = line.strip().split(" ", 1)[0]
        if name:
            names.append(name.rsplit("/", 1)[-1])
    return names


def offenders(names):
    return sorted(n for n in names if FORBIDDEN.match(n))


def main(argv):
    if argv[1:] == ["--self-test"]:
        planted = ["libc.so.6", "libtorch_cpu.so", "libc10.so", "libstdc++.so.6"]
        found = offenders(planted)
        if found != ["libc10.so", "libtorch_cpu.so"]:
            print(f"self-test: expected the planted libraries to be reported, got {found}")
            return 1
        print("self-test: planted libtorch_cpu.so and libc10.so reported")
        return 0
    if len(argv) != 2:
        print(__doc__)
        return 2
    found = offenders(loaded(argv[1]))
    if found:
        print(f"{argv[1]} loads LibTorch: {', '.join(found)}")
        return 1
    print(f"{argv[1]} loads no LibTorch library")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
