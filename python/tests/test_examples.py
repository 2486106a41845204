"""The Python examples run as documented (scripts/test-python.sh runs them)."""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.dist
def test_fsdp_demo_resumes_bitwise_on_two_ranks_and_on_one_process():
    # Four torchrun launches on CPU ranks (Gloo): reference, preempted by SIGTERM to one rank,
    # resumed on 2 ranks, resumed on 1 process; the script exits 0 only if both loss curves
    # match the reference bit for bit.
    run = subprocess.run([sys.executable, str(REPO / "examples/python/train_fsdp.py"), "--demo"],
                         capture_output=True, text=True, timeout=400)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "runs 2+3: 200 losses" in out and "bitwise equal to run 1" in out, out[-4000:]
    assert out.count("bitwise equal to run 1") == 2, out[-4000:]
    assert "signal 15 at step" in out, out[-4000:]
