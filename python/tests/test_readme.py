"""The README's ```python blocks: every block compiles and names only what tsnap has, and the
runnable ones run, in order, in one namespace, in a temporary working directory.

The README's loop trains a 1024x1024 layer for 10,000 steps, saving every 500. The test runs it
scaled down by the textual substitutions in SCALE (and waits for a save in flight rather than
skip the next one), and changes nothing else; a substitution
that no longer finds its text fails the test, so the table follows the README. Blocks that
start a process group (`init_process_group`: a launcher, several processes, GPUs) are only
compiled and checked, not run. The ```sh blocks are not run. The C++ blocks are compiled by the
C++ build (tests/readme/).
"""

import ast
import importlib.util
import inspect
import pathlib

import pytest
import torch

import tsnap

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"

# README text -> what the test runs instead: 20 steps of a 64x64 layer, a snapshot every 5.
# Scaled down, a step takes microseconds and a snapshot due while the previous one writes would
# be skipped (the hook's default), so the test waits for it instead, to know what to expect.
SCALE = {
    "10_000": "20",
    "every_steps=500": "every_steps=5",
    "1024": "64",
    "keep_last=3)": "keep_last=3, when_busy=\"wait\")",
}
# A block that contains one of these is compiled and checked, not run.
NOT_RUN = ("init_process_group",)


def _snippets():
    spec = importlib.util.spec_from_file_location("readme_snippets",
                                                  REPO / "scripts" / "readme_snippets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python_blocks():
    return _snippets().blocks(README.read_text(), "python")


def compile_block(block, code=None):
    """Compiled with README.md's line numbers, so a traceback points at the README."""
    source = "\n" * (block.line - 1) + (block.code if code is None else code)
    return compile(source, str(README), "exec")


def runs(block):
    return not any(marker in block.code for marker in NOT_RUN)


def test_readme_has_python_blocks():
    assert python_blocks(), "README.md has no ```python block"


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: f"README.md:{b.line}")
def test_block_compiles_and_names_what_tsnap_has(block):
    compile_block(block)
    tree = ast.parse(block.code)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "tsnap"):
            line = block.line + node.lineno - 1
            assert hasattr(tsnap, node.attr), f"README.md:{line}: tsnap has no {node.attr}"
        # Keywords of a direct call of a tsnap function or class, where Python can tell.
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "tsnap"
                and hasattr(tsnap, node.func.attr)):
            try:
                params = inspect.signature(getattr(tsnap, node.func.attr)).parameters
            except (TypeError, ValueError):  # a C++ function without a Python signature
                continue
            if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                continue
            line = block.line + node.lineno - 1
            for keyword in node.keywords:
                assert keyword.arg is None or keyword.arg in params, (
                    f"README.md:{line}: tsnap.{node.func.attr} takes no keyword {keyword.arg}")


def test_blocks_run_in_order(tmp_path, monkeypatch):
    blocks = [b for b in python_blocks() if runs(b)]
    unused = set(SCALE)
    scaled = []
    for block in blocks:
        code = block.code
        for text, replacement in SCALE.items():
            if text in code:
                unused.discard(text)
                code = code.replace(text, replacement)
        scaled.append((block, code))
    assert not unused, f"the README no longer has {sorted(unused)}: update SCALE"

    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    try:
        for block, code in scaled:
            exec(compile_block(block, code), namespace)  # noqa: S102 (the README's own code)

        # What the text says the blocks do: the loop ran to its end, saving every 5 steps and
        # keeping the newest 3; "best" holds the model in bf16 and loads back as saved.
        assert namespace["step"] == 20
        names = sorted(p.name for p in (tmp_path / "runs" / "exp1").iterdir()
                       if not p.name.startswith("."))
        assert names == ["best", "step-00000010", "step-00000015", "step-00000020"], names
        state = namespace["state"]
        assert state["epoch"] == 3
        assert state["model"]["weight"].dtype == torch.bfloat16
        assert tsnap.verify(tmp_path / "runs" / "exp1" / "best") == []
    finally:
        # Stops the hook's thread and restores the SIGTERM handler, even after a failed block.
        for name in ("hook", "snap"):
            if namespace.get(name) is not None:
                namespace[name].close()
