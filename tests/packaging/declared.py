#!/usr/bin/env python3
"""Fails when a function that the public headers declare is not exported by libtsnap.so.

A declaration in include/tsnap/ that no exported symbol serves compiles in a user's program and
then fails to link. This test asks clang for the declarations (its JSON AST of <tsnap/tsnap.h>,
with their mangled names) and compares them with the library's dynamic symbols: every function,
method, constructor and destructor declared there without a definition in the header (not
inline, constexpr, defaulted, deleted, pure or a template) must be exported.

Usage: declared.py --library LIB --compile-commands JSON --source FILE --clang CLANG++
  FILE is one of the library's translation units: its flags (include paths, definitions, the
  C++ standard) are the ones the headers are parsed with.
Exits 0 when every declared function is exported, 1 otherwise (naming them), 77 when clang is
missing (a skip for ctest).
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

FUNCTIONS = {"FunctionDecl", "CXXMethodDecl", "CXXConstructorDecl", "CXXDestructorDecl",
             "CXXConversionDecl"}
TEMPLATES = {"FunctionTemplateDecl", "ClassTemplateDecl",
             "ClassTemplatePartialSpecializationDecl"}


def flags_of(compile_commands, source):
    """The include paths, definitions and standard of `source`'s compile command."""
    with open(compile_commands) as f:
        commands = json.load(f)
    source = os.path.realpath(source)
    for c in commands:
        path = os.path.realpath(os.path.join(c["directory"], c["file"]))
        if path != source:
            continue
        args = c.get("arguments") or shlex.split(c["command"])
        out, i = [], 0
        while i < len(args):
            a = args[i]
            if a in ("-I", "-isystem", "-D", "-include"):
                out += [a, args[i + 1]]
                i += 2
                continue
            if a.startswith(("-I", "-D", "-std=", "-isystem")):
                out.append(a)
            i += 1
        return out
    raise SystemExit(f"declared: {source} is not in {compile_commands}")


class Walker:
    """Walks clang's JSON AST in the order it was printed, which locations need: a location
    names its file only when it differs from the one printed before."""

    def __init__(self, include_dir):
        self.include_dir = os.path.realpath(include_dir) + os.sep
        self.file = ""
        self.declared = {}   # mangled name -> readable name
        self.defined = set()  # mangled names defined in a header (inline)

    def _track(self, loc):
        if isinstance(loc, dict):
            if "file" in loc:
                self.file = loc["file"]
            for key in ("spellingLoc", "expansionLoc", "begin", "end"):
                if key in loc:
                    self._track(loc[key])

    def walk(self, node, in_template=False):
        if not isinstance(node, dict):
            return
        for key in ("loc", "range"):
            if key in node:
                self._track(node[key])
        file = self.file
        kind = node.get("kind", "")
        inner = node.get("inner", [])
        if kind in FUNCTIONS and not in_template and "mangledName" in node:
            has_body = any(isinstance(c, dict) and c.get("kind") == "CompoundStmt" for c in inner)
            header = os.path.realpath(file).startswith(self.include_dir) if file else False
            if (has_body or node.get("inline") or node.get("constexpr")
                    or node.get("explicitlyDefaulted") or node.get("explicitlyDeleted")):
                self.defined.add(node["mangledName"])
            elif header and not node.get("isImplicit") and not node.get("pure"):
                self.declared[node["mangledName"]] = node.get("name", "?")
        nested = in_template or kind in TEMPLATES
        for child in inner:
            self.walk(child, nested)


def parse_dump(text):
    """The JSON values of a filtered AST dump, which prints one after another."""
    decoder = json.JSONDecoder()
    i, out = 0, []
    while True:
        start = text.find("{", i)
        if start < 0:
            return out
        value, i = decoder.raw_decode(text, start)
        out.append(value)


def exported(library):
    text = subprocess.run(["nm", "-D", "--defined-only", library], check=True,
                          capture_output=True, text=True).stdout
    names = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            names.add(parts[2].split("@")[0])
    return names


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--library", required=True)
    p.add_argument("--compile-commands", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--include-dir", required=True)
    p.add_argument("--clang", default="clang++")
    args = p.parse_args()
    clang = shutil.which(args.clang)
    if clang is None:
        print(f"declared: {args.clang} not found; skipped")
        return 77
    flags = flags_of(args.compile_commands, args.source)
    with tempfile.TemporaryDirectory() as tmp:
        tu = os.path.join(tmp, "public.cpp")
        with open(tu, "w") as f:
            f.write("#include <tsnap/tsnap.h>\n")
        run = subprocess.run([clang, "-fsyntax-only", "-w", *flags, "-Xclang", "-ast-dump=json",
                              "-Xclang", "-ast-dump-filter=tsnap", tu],
                             capture_output=True, text=True)
    if run.returncode != 0:
        print("declared: clang could not parse <tsnap/tsnap.h>:\n" + run.stderr[-4000:])
        return 1
    walker = Walker(args.include_dir)
    for value in parse_dump(run.stdout):
        walker.walk(value)
    declared = {m: n for m, n in walker.declared.items() if m not in walker.defined}
    if not declared:
        print("declared: found no declarations (the AST walk is broken)")
        return 1
    missing = sorted(set(declared) - exported(args.library))
    if missing:
        readable = subprocess.run(["c++filt"], input="\n".join(missing), capture_output=True,
                                  text=True).stdout.splitlines()
        print(f"declared: {len(missing)} of {len(declared)} functions the public headers declare "
              f"are not exported by {args.library} (a call compiles, then fails to link):")
        for name in readable or missing:
            print("  " + name)
        return 1
    print(f"declared: all {len(declared)} functions the public headers declare are exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
