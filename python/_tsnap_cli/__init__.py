"""The ``tsnap`` console script: runs the command-line tool that comes with the package.

It lives outside the ``tsnap`` package so that starting the tool does not import torch (the
tool itself needs no LibTorch; its commands that make tensors run in ``tsnap-torch``).
"""

from __future__ import annotations

import importlib.util
import os
import sys


def tool_path() -> str:
    """The path of the bundled ``tsnap`` program (``<site-packages>/tsnap/bin/tsnap``)."""
    spec = importlib.util.find_spec("tsnap")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("tsnap: the tsnap package is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "bin", "tsnap")


def main() -> None:
    tool = tool_path()
    if not os.access(tool, os.X_OK):
        raise SystemExit(f"tsnap: this installation has no command-line tool ({tool} is missing); "
                         "reinstall the tsnap package")
    os.execv(tool, [tool, *sys.argv[1:]])
