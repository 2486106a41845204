#!/usr/bin/env python3
"""Fails when a source includes a header of a layer above or beside its own (docs/architecture.md).

Layers, bottom-up; a folder under src/ may include its own headers and the headers of the folders
below it, never beside or above it:

    common  ->  io  ->  format  ->  plan  ->  stage  ->  dist  ->  pipeline | restore  ->  state
    ->  policy  ->  cli, bench, python

io throws tsnap::Error (common/error.cpp), so common sits below it. pipeline (write) and restore
(read) are siblings: neither includes the other, public headers included; what both need (the
catalog, naming rules, hot images) lies below them. dist (a DistGroup, and the Coordinator
interface through which ranks agree over its store) sits just below pipeline, whose
SnapshotterOptions take a DistGroup, and policy, whose periodic hooks post triggers through it.
bench/ and python/ (the Python package's binding) sit at the level of cli; the one include beside
a layer that is allowed is cli/ -> bench/ (`tsnap bench` is a front-end over the bench library),
never the other way.

Public headers. An include of "tsnap/<name>.h" counts as an include of the folder that implements
that header (PUBLIC below), so a folder cannot reach a layer above or beside it through the public
API. The rule that picks the folder:
  - a header that declares functions or classes defined out of line maps to the folder holding
    those definitions (tsnap/catalog.h -> format/, where list() and latest() are defined);
  - a header of types only (structs, enums, macros, inline code: export.h, progress.h,
    engine_kind.h, apply_report.h) maps to the lowest folder that reads or fills
    those types, so it is allowed there and everywhere above;
  - no header is split over several folders: a declaration lives in the header of the folder
    that defines it (the load overloads of a HotSnapshot are in load.h, restore/;
    the HotSnapshot class in hot_snapshot.h, stage/; save_options.h, whose
    optimizer_moment_keys() is defined in plan/, where the options are first read);
  - the umbrella tsnap/tsnap.h includes every public header, so it maps to the top layer: only
    cli/, bench/ and python/ may include it.
The public headers are checked too, each at the layer of its folder, so a chain of public
includes (a stage-level header including a restore-level one) cannot smuggle an edge in. A header
in include/tsnap/ missing from PUBLIC is an error.

Usage: scripts/check-layers.py [REPO]: exit 1 with one line per violation.
       scripts/check-layers.py --self-test: runs the check on a temporary tree with planted
       violations (an upward include through a public header, quoted and in angle brackets, a
       sideways include, plain and relative, the binding including an internal header) and
       exits 1 unless all of them, and nothing else, are reported.
The Python binding (python/) and the examples (examples/) use the public API only: any include
of a header under src/ there is a violation.
"""
import pathlib
import sys
import tempfile

LAYERS = [
    ["common"],
    ["io"],
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
# Users of the library, which include its public headers only: the Python binding and the
# examples (examples/ sits at the top, with the binding).
PUBLIC_ONLY = {"python", "examples"}
LEVEL["examples"] = LEVEL["python"]
# (includer, included) pairs allowed beside each other.
ALLOWED_BESIDE = {("cli", "bench")}

# Each public header -> the folder that implements it (see the docstring for the rule).
PUBLIC = {
    # common/: error.cpp (make_error, throw_error, to_string), state_dict.cpp; macros; the
    # Progress callback type that common/progress_meter reports through.
    "error.h": "common",
    "export.h": "common",
    "state_dict.h": "common",
    "progress.h": "common",
    # io/: the engine kinds and in-flight policies that io/engine_host.h selects by.
    "engine_kind.h": "io",
    # format/: manifest.cpp, manifest_parse.cpp, manifest_write.cpp (read_manifest, the
    # records); catalog.cpp.
    "manifest.h": "format",
    "catalog.h": "format",
    # plan/: SaveOptions, DtypeRule, Staging are read first by plan::make_plan.
    "save_options.h": "plan",
    # stage/: HotSnapshot's members are defined in hot_image.cpp.
    "hot_snapshot.h": "stage",
    # dist/: dist_group.cpp.
    "dist_group.h": "dist",
    # pipeline/: save.cpp, save_handle.cpp, snapshotter.cpp, remove.cpp, agent.cpp.
    "agent.h": "pipeline",
    "save.h": "pipeline",
    "save_handle.h": "pipeline",
    "snapshotter.h": "pipeline",
    "remove.h": "pipeline",
    # restore/: load.cpp (load, load_into, verify), reader.cpp, hf_export.cpp.
    "load.h": "restore",
    "reader.h": "restore",
    "hf_export.h": "restore",
    # state/: checkpoint.cpp, model_state.cpp, optimizer_state.cpp, rng_state.cpp,
    # stateful.cpp; the ApplyReport that apply.cpp fills.
    "checkpoint.h": "state",
    "model_state.h": "state",
    "optimizer_state.h": "state",
    "rng_state.h": "state",
    "stateful.h": "state",
    "apply_report.h": "state",
    # policy/: periodic_snapshots.cpp, summary.cpp, schedule.cpp.
    "periodic_snapshots.h": "policy",
    "schedule.h": "policy",
    # The umbrella: everything.
    "tsnap.h": "cli",
}

SUFFIXES = (".h", ".cpp")


def included(line: str):
    """The path of a quoted #include on this line, or of an <tsnap/...> one, or None."""
    s = line.strip()
    if not s.startswith("#"):
        return None
    s = s[1:].lstrip()
    if not s.startswith("include"):
        return None
    s = s[len("include"):].strip()
    if s.startswith("<tsnap/"):
        end = s.find(">", 1)
        return s[1:end] if end > 0 else None
    if not s.startswith('"'):
        return None  # <...>: a library's header
    end = s.find('"', 1)
    return s[1:end] if end > 0 else None


def resolved(repo: pathlib.Path, path: pathlib.Path, inc: str):
    """An include as the folder path the checks know ("pipeline/save_job.h", "tsnap/load.h"):
    one relative to the including file ("../restore/x.h", "./y.h") is resolved against it and
    named from src/ (or include/); None when it lands elsewhere."""
    if not inc.startswith(("./", "../")):
        return inc
    target = (path.parent / inc).resolve()
    for base in (repo / "src", repo / "include"):
        try:
            return target.relative_to(base.resolve()).as_posix()
        except ValueError:
            continue
    return None


def check(repo: pathlib.Path):
    """Returns (number of sources, one line per violation) for the tree at `repo`."""
    problems = []
    sources = []  # (path, layer)
    public_dir = repo / "include" / "tsnap"
    if public_dir.is_dir():
        for path in sorted(public_dir.glob("*.h")):
            if path.name not in PUBLIC:
                problems.append(f"{path.relative_to(repo)}: public header with no folder "
                                f"(add it to PUBLIC in {pathlib.Path(__file__).name})")
                continue
            sources.append((path, PUBLIC[path.name]))
    for top in ("src", "bench", "python", "examples"):
        for path in sorted((repo / top).rglob("*")):
            if path.suffix not in SUFFIXES:
                continue
            rel = path.relative_to(repo)
            sources.append((path, rel.parts[0] if top != "src" else rel.parts[1]))
    for path, layer in sources:
        rel = path.relative_to(repo)
        if layer not in LEVEL:
            problems.append(f"{rel}: folder '{layer}' has no layer "
                            f"(add it to LAYERS in {pathlib.Path(__file__).name})")
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            inc = included(line)
            if inc:
                inc = resolved(repo, path, inc)
            if not inc or "/" not in inc:
                continue
            top = inc.split("/", 1)[0]
            if layer in PUBLIC_ONLY and top in LEVEL:
                problems.append(f"{rel}:{lineno}: {layer} includes {inc} ({line.strip()}), an "
                                "internal header: it uses the public API (include/tsnap/) only")
                continue
            if top == "tsnap":
                name = inc.split("/", 1)[1]
                if name not in PUBLIC:
                    problems.append(f"{rel}:{lineno}: includes {inc}, a public header with no "
                                    f"folder (add it to PUBLIC in {pathlib.Path(__file__).name})")
                    continue
                target, via = PUBLIC[name], f" via {inc}"
            elif top in LEVEL:
                target, via = top, ""
            else:
                continue  # a library's header
            if target == layer or (layer, target) in ALLOWED_BESIDE:
                continue
            if inc == "tsnap/tsnap.h" and LEVEL[layer] == LEVEL[target]:
                continue  # the umbrella, at the top layer
            if LEVEL[target] >= LEVEL[layer]:
                where = "beside" if LEVEL[target] == LEVEL[layer] else "above"
                problems.append(f"{rel}:{lineno}: {layer} includes {target}/{via} "
                                f"({line.strip()}), a layer {where} it")
    return len(sources), problems


def self_test() -> int:
    """Plants one upward include through a public header and one sideways include."""
    planted = {
        "src/format/planted_up.cpp": '#include "tsnap/snapshotter.h"\n',
        "src/pipeline/planted_beside.cpp": '#include "restore/read_plan.h"\n',
        # Allowed edges, which must not be reported.
        "src/pipeline/allowed.cpp": ('#include "tsnap/catalog.h"\n#include "format/layout.h"\n'
                                     '#include "tsnap/dist_group.h"\n#include <vector>\n'),
        "src/cli/allowed.cpp": '#include "bench/runner.h"\n#include "tsnap/tsnap.h"\n',
        # The blind spots a simpler check had: an angle-bracket public include, a relative
        # include, and the binding reaching past the public API.
        "src/format/planted_angle.cpp": "#include <tsnap/snapshotter.h>\n",
        "src/pipeline/planted_relative.cpp": '#include "../restore/read_plan.h"\n',
        "python/src/planted_internal.cpp": ('#include "pipeline/save_job.h"\n'
                                            '#include "tsnap/snapshotter.h"\n'),
        "examples/allowed.cpp": "#include <tsnap/tsnap.h>\n#include <torch/torch.h>\n",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for rel, text in planted.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        _, problems = check(root)
    expected = [
        ("src/format/planted_up.cpp:1:", "format includes pipeline/ via tsnap/snapshotter.h"),
        ("src/pipeline/planted_beside.cpp:1:", "pipeline includes restore/"),
        ("src/format/planted_angle.cpp:1:", "format includes pipeline/ via tsnap/snapshotter.h"),
        ("src/pipeline/planted_relative.cpp:1:", "pipeline includes restore/"),
        ("python/src/planted_internal.cpp:1:", "an internal header"),
    ]
    missing = [e for e in expected
               if not any(p.startswith(e[0]) and e[1] in p for p in problems)]
    unexpected = [p for p in problems
                  if not any(p.startswith(e[0]) and e[1] in p for e in expected)]
    for p in problems:
        print(f"self-test: reported {p}")
    for e in missing:
        print(f"self-test: NOT reported: {e[0]} {e[1]}")
    for p in unexpected:
        print(f"self-test: reported an allowed include: {p}")
    if missing or unexpected:
        print("check-layers: self-test failed", file=sys.stderr)
        return 1
    print("check-layers: self-test passed (every planted violation reported, nothing else)")
    return 0


def main() -> int:
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    repo = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parent.parent)
    count, problems = check(repo)
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} include(s) break the layering", file=sys.stderr)
        return 1
    print(f"check-layers: {count} sources respect the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
