"""Creates a virtual environment that holds torch and what torch requires, and nothing else.

    python scripts/torch_only_venv.py DEST

Run with the interpreter of an environment that has torch installed (.venv): the new one at
DEST (removed first) gets the same distributions, found from torch's requirements
(Requires-Dist, with their markers; extras left out), by hard links to their installed files
(or copies across file systems), so that no 5 GB download is repeated. pip in DEST sees them as
installed. Their scripts (bin/) are left out.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shutil
import sys
import sysconfig
import venv
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name


def closure(root: str) -> list[metadata.Distribution]:
    """The distribution named root and every one it requires, transitively, as pip would
    install them: with the extras that requirements name (``cuda-toolkit[cudart]``)."""
    seen: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()  # (distribution, extra or "")
    todo: list[tuple[str, str]] = [(root, "")]
    while todo:
        name, extra = todo.pop()
        name = canonicalize_name(name)
        if (name, extra) in done:
            continue
        done.add((name, extra))
        dist = seen.setdefault(name, metadata.distribution(name))
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            if req.marker is None and extra:
                continue  # the base requirements come with extra ""
            todo.extend((req.name, e) for e in ["", *sorted(req.extras)])
    return list(seen.values())


def link(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: torch_only_venv.py DEST")
    dest = Path(sys.argv[1]).absolute()
    shutil.rmtree(dest, ignore_errors=True)
    venv.create(dest, with_pip=True)
    source_site = Path(sysconfig.get_paths()["purelib"]).resolve()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    dest_site = dest / "lib" / version / "site-packages"
    names = []
    for dist in closure("torch"):
        names.append(f"{dist.metadata['Name']}=={dist.version}")
        for file in dist.files or []:
            path = Path(str(dist.locate_file(file))).resolve()
            if path.is_file() and path.is_relative_to(source_site):
                link(path, dest_site / path.relative_to(source_site))
    print(f"torch_only_venv: {dest} holds {len(names)} distributions: {' '.join(sorted(names))}")


if __name__ == "__main__":
    main()
