#!/usr/bin/env python3
"""Fails when a source includes a header of a higher layer (docs/architecture.md).

Layers, bottom-up; a folder under src/ may include its own headers, the public headers
(include/tsnap/), and the headers of the folders below it:

    common, io  ->  format  ->  plan  ->  stage  ->  dist  ->  pipeline | restore  ->  state
    ->  policy  ->  cli

pipeline (write) and restore (read) are siblings: neither includes the other. bench/ and python/ (the
Python package's binding) sit at the level of cli; the one include beside a layer that is allowed is cli/ -> bench/ (`tsnap bench` is a
front-end over the bench library), never the other way. Usage: scripts/check-layers.py [REPO]; exit 1 with one line per violation.
"""
import pathlib
import re
import sys

LAYERS = [
    ["common", "io"],
    ["format"],
    ["plan"],
    ["stage"],
    ["dist"],
    ["pipeline", "restore"],
    ["state"],
    ["policy"],
    ["cli", "bench", "python"],
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}
# (includer, included) pairs allowed beside each other.
ALLOWED_BESIDE = {("cli", "bench")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"', re.M)


def main() -> int:
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    problems = []
    sources = [p for p in (repo / "src").rglob("*") if p.suffix in (".h", ".cpp")]
    for top in ("bench", "python"):
        sources += [p for p in (repo / top).rglob("*") if p.suffix in (".h", ".cpp")]
    for path in sorted(sources):
        rel = path.relative_to(repo)
        layer = rel.parts[0] if rel.parts[0] in ("bench", "python") else rel.parts[1]
        if layer not in LEVEL:
            problems.append(f"{rel}: folder '{layer}' has no layer (add it to {__file__})")
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m or m.group(1) in ("tsnap", layer):
                continue
            target = m.group(1)
            if target not in LEVEL:
                continue  # a library's header (e.g. "nlohmann/json.hpp" is <...> anyway)
            if (layer, target) in ALLOWED_BESIDE:
                continue
            if LEVEL[target] >= LEVEL[layer]:
                problems.append(f"{rel}:{lineno}: {layer} includes {target}/ ({line.strip()}), "
                                f"a layer {'beside' if LEVEL[target] == LEVEL[layer] else 'above'} it")
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} include(s) break the layering", file=sys.stderr)
        return 1
    print(f"check-layers: {len(sources)} sources respect the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
