"""A snapshot agent (``tsnap agent``) keeps a killed process's saves and its last snapshot."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import tsnap

TRAINER = textwrap.dedent("""
    import sys, torch, tsnap
    root, sock = sys.argv[1], sys.argv[2]
    snap = tsnap.Snapshotter(root, chunk_bytes=1 << 16, agent=sock)
    hook = tsnap.PeriodicSnapshots(snap, lambda: state, every_steps=1, when_busy="wait",
                                   log=False)
    for step in range(1, 6):
        g = torch.Generator().manual_seed(step)
        state = {"w": torch.randn(300_000, generator=g), "step": torch.tensor(step)}
        hook.after_step(step)
        print(step, flush=True)      # the save of `step` returned
    hook.finish()
    print("done", flush=True)
    sys.stdin.read()                  # killed here, or mid-save above
""")


def expected(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(300_000, generator=g), "step": torch.tensor(step)}


@pytest.fixture
def agent(tmp_path: Path):
    tool = Path(sys.executable).parent / "tsnap"
    if not os.access(tool, os.X_OK):
        pytest.skip(f"no tsnap tool at {tool}")
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen([str(tool), "agent", "--socket", str(sock)],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the agent did not start"
        time.sleep(0.05)
    yield sock
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def run_trainer(root: Path, sock: Path, kill_after: int | None) -> int:
    """Runs the trainer; kills it (SIGKILL) right after the save of step `kill_after`
    returned. Returns the last step it reported."""
    p = subprocess.Popen([sys.executable, "-c", TRAINER, str(root), str(sock)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    last = 0
    assert p.stdout is not None
    for line in p.stdout:
        if line.strip() == "done":
            break
        last = int(line)
        if kill_after is not None and last >= kill_after:
            break
    p.kill()
    p.wait()
    return last


def test_saves_outlive_a_killed_trainer_and_resume_from_memory(tmp_path: Path, agent: Path):
    root = tmp_path / "run"
    last = run_trainer(root, agent, kill_after=3)
    assert last == 3
    # Every save that returned is committed (the agent finished what the trainer could not).
    deadline = time.monotonic() + 30
    while not (root / "step-00000003" / "MANIFEST.json").exists():
        assert time.monotonic() < deadline, sorted(os.listdir(root))
        time.sleep(0.05)
    for step in range(1, last + 1):
        got = tsnap.load(root / f"step-{step:08d}")
        want = expected(step)
        assert all(torch.equal(got[k], want[k]) for k in want), step

    # A finished run: then every snapshot on disk is removed; a restart resumes from memory.
    run_trainer(root, agent, kill_after=None)
    time.sleep(0.2)  # the agent notices the link closed
    for entry in root.iterdir():
        shutil.rmtree(entry)
    snap = tsnap.Snapshotter(root, chunk_bytes=1 << 16, agent=agent)
    state: dict[str, torch.Tensor] = {}
    hook = tsnap.PeriodicSnapshots(snap, lambda: state, every_steps=1, log=False)
    resumed: dict[str, torch.Tensor] = {}
    step = hook.resume(lambda s: resumed.update(s))
    assert step == 5
    assert all(torch.equal(resumed[k], v) for k, v in expected(5).items())
    hook.close()
    snap.close()


def test_no_agent_fails_or_falls_back(tmp_path: Path):
    with pytest.raises(tsnap.IoError, match="agent.sock"):
        tsnap.Snapshotter(tmp_path / "a", agent=tmp_path / "agent.sock")
    snap = tsnap.Snapshotter(tmp_path / "b", agent=tmp_path / "agent.sock", agent_fall_back=True)
    snap.save_async("s", {"w": torch.ones(10)}).wait()
    assert torch.equal(tsnap.load(tmp_path / "b" / "s")["w"], torch.ones(10))
    snap.close()
