#!/usr/bin/env python3
"""Extracts the code blocks of README.md so that tests compile and run them.

    readme_snippets.py check [--readme README.md]
        Fails when a fence is left open, has no language (it would escape the tests) or names
        one the tests do not know.
    readme_snippets.py list-outputs [--readme README.md]
        Prints the names of the files `cpp` writes, one per line (for CMake).
    readme_snippets.py cpp --readme README.md --out-dir DIR
        Writes DIR/readme_blocks.cpp, one translation unit in which every ```cpp block becomes
        a function `void readme_block_<line>()`, and DIR/readme_includes_<k>.cpp for the k-th
        block that includes a tsnap header other than the umbrella <tsnap/tsnap.h>. Files whose
        contents did not change are not rewritten.

How the C++ blocks are compiled (tests/readme/):
  - readme_blocks.cpp: tests/readme/prelude.h with LibTorch (TSNAP_README_WITH_TORCH), then
    every block's own #include lines, hoisted (the first block's <tsnap/tsnap.h> among them),
    then the blocks, then tests/readme/definitions.h, which defines the prelude's globals so
    that the program links: a README call that no exported symbol serves fails the build.
    Blocks without #include lines continue the README's first block, which includes
    <torch/torch.h> and <tsnap/tsnap.h>.
  - readme_includes_<k>.cpp: prelude.h without LibTorch (forward declarations only), then
    that block's own #include lines, then the block: a block that names its headers must name
    every tsnap header it needs (compiled, never linked).
Each block's body is preceded by a #line directive, so compiler errors name README.md's lines.

Used by python/tests/test_readme.py for the ```python blocks (`blocks(text, "python")`).
"""
import argparse
import pathlib
import re
import sys

# Languages of the README's fences: the tests compile or run cpp and python; the others are
# shell commands and build files, which they leave alone.
CHECKED = ("cpp", "python")
KNOWN = CHECKED + ("sh", "cmake")
UMBRELLA = "tsnap/tsnap.h"

_FENCE_OPEN = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")
_FENCE_CLOSE = re.compile(r"^```\s*$")
_INCLUDE = re.compile(r"^\s*#\s*include\s*([<\"])([^>\"]+)[>\"]")


class Block:
    """One fenced block: its language, the README line of its first code line, its lines."""

    def __init__(self, lang, line, lines):
        self.lang = lang
        self.line = line
        self.lines = lines

    @property
    def code(self):
        return "\n".join(self.lines) + "\n"

    def includes(self):
        """The block's #include lines, as written."""
        return [l.strip() for l in self.lines if _INCLUDE.match(l)]

    def body(self):
        """(README line of the first body line, the lines without #include lines), where the
        body starts after the leading includes and blank lines."""
        n = 0
        while n < len(self.lines) and (_INCLUDE.match(self.lines[n]) or not self.lines[n].strip()):
            n += 1
        rest = self.lines[n:]
        if any(_INCLUDE.match(l) for l in rest):
            raise ValueError(f"README.md:{self.line}: #include after code (hoisting it would "
                             "change the block's meaning)")
        return self.line + n, rest

    def tsnap_headers(self):
        headers = []
        for l in self.lines:
            m = _INCLUDE.match(l)
            if m and m.group(2).startswith("tsnap/"):
                headers.append(m.group(2))
        return headers

    def names_own_headers(self):
        """True when the block includes tsnap headers of its own, other than the umbrella."""
        headers = self.tsnap_headers()
        return bool(headers) and UMBRELLA not in headers


def parse(text):
    """Every fenced block of `text` (any language), in order. Raises ValueError on a fence
    that is never closed."""
    found = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not _FENCE_CLOSE.match(lines[i]):
            i += 1
        if i == len(lines):
            raise ValueError(f"README.md:{start + 1}: code fence never closed")
        found.append(Block(m.group(1), start + 2, lines[start + 1:i]))
        i += 1
    return found


def blocks(text, lang):
    """The blocks of one language, in order."""
    return [b for b in parse(text) if b.lang == lang]


def check(text):
    """Problems with the README's fences, one message each."""
    try:
        found = parse(text)
    except ValueError as e:
        return [str(e)]
    problems = []
    for b in found:
        if not b.lang:
            problems.append(f"README.md:{b.line - 1}: code fence without a language "
                            f"(one of {', '.join(KNOWN)}), so no test would check it")
        elif b.lang not in KNOWN:
            problems.append(f"README.md:{b.line - 1}: code fence language '{b.lang}' is not one "
                            f"of {', '.join(KNOWN)}: the README tests would not know what to "
                            "do with it")
        elif b.lang == "cpp":
            try:
                b.body()
            except ValueError as e:
                problems.append(str(e))
    return problems


def _function(block, readme_path):
    first, body = block.body()
    out = [f"void readme_block_{block.line}() {{", f'#line {first} "{readme_path}"']
    out += body
    out.append("}")
    return out


_HEADER = "// Generated by scripts/readme_snippets.py from {readme}: do not edit.\n"


def main_tu(cpp_blocks, readme_path):
    includes = []
    for b in cpp_blocks:
        for inc in b.includes():
            if inc not in includes:
                includes.append(inc)
    out = [_HEADER.format(readme=readme_path).rstrip("\n"),
           "// Every ```cpp block of the README, each in its own function, compiled and linked.",
           "#define TSNAP_README_WITH_TORCH 1",
           '#include "prelude.h"',
           "",
           "// The blocks' own #include lines."]
    out += includes
    for b in cpp_blocks:
        out.append("")
        out += _function(b, readme_path)
    out += ["", "// The prelude's globals, defined after every block so that they hide no missing "
            "include.", '#include "definitions.h"', "", "int main() { return 0; }", ""]
    return "\n".join(out)


def includes_tu(block, readme_path):
    out = [_HEADER.format(readme=readme_path).rstrip("\n"),
           f"// The README's block at line {block.line}, with only its own #include lines.",
           '#include "prelude.h"',
           ""]
    out += block.includes()
    out.append("")
    out += _function(block, readme_path)
    out.append("")
    return "\n".join(out)


def _write_if_changed(path, content):
    if path.exists() and path.read_text() == content:
        return
    path.write_text(content)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["check", "list-outputs", "cpp"])
    parser.add_argument("--readme", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent.parent / "README.md")
    parser.add_argument("--out-dir", type=pathlib.Path)
    args = parser.parse_args(argv)
    text = args.readme.read_text()

    problems = check(text)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if args.command == "check":
        return 0
    # Relative to the checkout: compiler messages read README.md:LINE, and ccache (whose base
    # directory is the checkout) serves another clone the same objects.
    readme_path = args.readme.name
    cpp_blocks = blocks(text, "cpp")
    outputs = {"readme_blocks.cpp": main_tu(cpp_blocks, readme_path)}
    # Numbered, not named by line: the set of files changes only when such a block is added or
    # removed, not whenever the text above one moves it.
    own = [b for b in cpp_blocks if b.names_own_headers()]
    for k, b in enumerate(own, 1):
        outputs[f"readme_includes_{k}.cpp"] = includes_tu(b, readme_path)
    if args.command == "list-outputs":
        print("\n".join(outputs))
        return 0
    if args.out_dir is None:
        parser.error("cpp needs --out-dir")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, content in outputs.items():
        _write_if_changed(args.out_dir / name, content)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
