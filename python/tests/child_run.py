"""Child training runs the trainer tests kill and resume: a script from a template, run in a
fresh interpreter, and the loss curve it writes ("step loss" lines)."""

import os
import pathlib
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_child(tmp_path, source, *args):
    """Runs `source` (formatted with {tests}, this folder) as a script in tmp_path."""
    script = tmp_path / "child.py"
    script.write_text(source.format(tests=TESTS))
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


def read_losses(path):
    """The loss curve a child wrote: {step: loss text}, bit-exact as printed."""
    return dict(line.split() for line in pathlib.Path(path).read_text().splitlines())
