"""tsnap.accelerate: an Accelerator's state saved and resumed through tsnap snapshots."""

import errno
import os
import random
import signal

import pytest
import torch

pytest.importorskip("accelerate")

import child_run  # noqa: E402
import numpy as np  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from accelerate.utils import ProjectConfiguration  # noqa: E402
from child_run import read_losses  # noqa: E402

import tsnap  # noqa: E402
import tsnap.accelerate  # noqa: E402

EPOCHS = 4


class Counter:
    """An object registered for checkpointing."""

    def __init__(self):
        self.seen = 0
        self.history = []

    def state_dict(self):
        return {"seen": self.seen, "history": list(self.history)}

    def load_state_dict(self, sd):
        self.seen, self.history = sd["seen"], list(sd["history"])


def setup(project_dir, total_limit=2, seed=0):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(project_dir), automatic_checkpoint_naming=True, total_limit=total_limit))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    g = torch.Generator().manual_seed(1)
    ds = torch.utils.data.TensorDataset(torch.randn(40, 8, generator=g), torch.randn(40, 1,
                                                                                     generator=g))
    dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    return acc, model, opt, dl, sched, counter


def epoch(acc, model, opt, dl, sched, counter):
    """One epoch; every RNG (torch: shuffle and dropout, NumPy, Python) shapes the losses."""
    losses = []
    model.train()
    for x, y in dl:
        noise = float(np.random.rand()) * 1e-3 + random.random() * 1e-3
        loss = torch.nn.functional.mse_loss(model(x), y) + noise
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
        counter.seen += 1
    counter.history.append(round(losses[-1], 6))
    return losses


def scramble():
    torch.manual_seed(1234)
    np.random.seed(99)
    random.seed(7)


def seed_all():
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


def test_save_resume_bit_identical_with_retention(tmp_path):
    seed_all()
    acc, *objs = setup(tmp_path / "ref")
    ref = [epoch(acc, *objs) for _ in range(EPOCHS)]
    ref_params = [p.detach().clone() for p in objs[0].parameters()]

    # Train 2 epochs, saving at the end of each (total_limit=2 keeps both).
    seed_all()
    acc, *objs = setup(tmp_path / "run")
    ckpt = tsnap.accelerate.checkpointer(acc)
    got = []
    for _ in range(2):
        got.append(epoch(acc, *objs))
        path = tsnap.accelerate.save_state(acc)
    assert ckpt.in_flight in ([], [path], [path.replace("_1", "_0"), path])
    tsnap.accelerate.wait(acc)
    root = tmp_path / "run" / "checkpoints"
    assert sorted(os.listdir(root)) == ["checkpoint_0", "checkpoint_1"]
    assert tsnap.verify(root / "checkpoint_1") == []
    assert tsnap.metadata(root / "checkpoint_1")["tsnap_accelerate"]["iteration"] == 1

    # New objects, other seeds and RNG states: resume from the newest and finish.
    scramble()
    acc, *objs = setup(tmp_path / "run", seed=5)
    assert tsnap.accelerate.load_state(acc) == str(root / "checkpoint_1")
    assert acc.save_iteration == 2
    assert objs[-1].seen == 10 and len(objs[-1].history) == 2
    for _ in range(2, EPOCHS):
        got.append(epoch(acc, *objs))
        tsnap.accelerate.save_state(acc)
    tsnap.accelerate.wait(acc)
    assert got == ref  # the loss curve, bit for bit
    for a, b in zip(ref_params, objs[0].parameters()):
        assert torch.equal(a, b.detach())
    # total_limit=2: checkpoint_0 and _1 removed once the newer saves committed.
    assert sorted(os.listdir(root)) == ["checkpoint_2", "checkpoint_3"]
    tsnap.accelerate.checkpointer(acc).close()


def test_staging_buffers_are_ready_before_the_first_save(tmp_path):
    # A Checkpointer made right after prepare() sizes its buffers after the first optimizer
    # step (the moments exist by then), so that the first save stalls no longer than the later.
    acc, *objs = setup(tmp_path / "run")
    cp = tsnap.accelerate.checkpointer(acc)
    snap = cp._saves.snapshotter(str(tmp_path / "run" / "checkpoints"))
    assert snap.staging_budget == 0
    epoch(acc, *objs)
    assert snap.staging_budget > 0
    path = tsnap.accelerate.save_state(acc)
    tsnap.accelerate.wait(acc)
    assert tsnap.verify(path) == []
    cp.close()


def test_explicit_output_dir_and_errors(tmp_path):
    acc, model, opt, dl, sched, counter = setup(tmp_path / "p")
    acc.project_configuration.automatic_checkpoint_naming = False
    ckpt = tsnap.accelerate.Checkpointer(acc)
    out = tmp_path / "out" / "ckpt"
    ckpt.save_state(out)
    ckpt.save_state(out)  # replaced atomically
    ckpt.wait()
    assert tsnap.verify(out) == []
    state = tsnap.load(out)
    assert set(state) == {"models", "optimizers", "schedulers", "dataloaders", "scaler", "rng",
                          "step", "custom"}
    ckpt.load_state(out)

    counter.history.append(object())
    with pytest.raises(tsnap.InvalidArgument, match="'custom/0/history/0'"):
        ckpt.save_state(tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    counter.history.clear()

    with pytest.raises(tsnap.InvalidArgument, match="output_dir"):
        ckpt.save_state()
    with pytest.raises(tsnap.IoError, match="nothing to load"):
        ckpt.load_state(tmp_path / "missing")
    os.makedirs(tmp_path / "plain")
    with pytest.raises(tsnap.FormatError, match="not a tsnap snapshot"):
        ckpt.load_state(tmp_path / "plain")

    acc.register_for_checkpointing(Counter())  # one more object than the snapshot holds
    with pytest.raises(tsnap.InvalidArgument, match="holds 1 custom"):
        ckpt.load_state(out)

    handle = acc.register_save_state_pre_hook(lambda models, weights, d: None)
    with pytest.raises(tsnap.Error, match="pre-hook"):
        ckpt.save_state(out)
    handle.remove()
    ckpt.close()


def test_automatic_naming_refuses_an_existing_iteration(tmp_path):
    acc, *_ = setup(tmp_path / "p", total_limit=None)
    tsnap.accelerate.save_state(acc)
    acc.project_configuration.iteration = 0
    with pytest.raises(tsnap.Error, match="already exists"):
        tsnap.accelerate.save_state(acc)
    tsnap.accelerate.wait(acc)


# -- a crash mid-run, a full disk ------------------------------------------------------------------

CHILD = r"""
import os, sys, time
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
import test_accelerate as T
import tsnap.accelerate

mode, project, losses = sys.argv[1:4]


def record(path, epoch, values):
    with open(path, "a") as f:
        f.writelines(f"{{epoch}}:{{i}} {{v.hex()}}\n" for i, v in enumerate(values))


if mode == "kill":
    T.seed_all()
    acc, *objs = T.setup(project)
    for epoch in range(T.EPOCHS):
        if epoch == 2:  # mid-epoch, once a checkpoint is committed; the newest may be in flight
            while not any(T.tsnap._integration.is_snapshot(os.path.join(project, "checkpoints", n))
                          for n in ("checkpoint_0", "checkpoint_1")):
                time.sleep(0.005)
            os.kill(os.getpid(), 9)
        record(losses, epoch, T.epoch(acc, *objs))
        tsnap.accelerate.save_state(acc)
else:
    T.scramble()
    acc, *objs = T.setup(project, seed=5)
    tsnap.accelerate.load_state(acc)     # the newest committed checkpoint_<n>
    for epoch in range(acc.save_iteration, T.EPOCHS):
        record(losses, epoch, T.epoch(acc, *objs))
        tsnap.accelerate.save_state(acc)
    tsnap.accelerate.wait(acc)
    T.seed_all()
    acc, *objs = T.setup(project + "-ref")
    for epoch in range(T.EPOCHS):
        record(losses + ".ref", epoch, T.epoch(acc, *objs))
"""


def run_child(tmp_path, *args):
    return child_run.run_child(tmp_path, CHILD, *args)


def test_kill_9_mid_run_then_load_state_resumes_bit_identically(tmp_path):
    project, killed, resumed = tmp_path / "run", tmp_path / "killed", tmp_path / "resumed"
    child = run_child(tmp_path, "kill", project, killed)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    root = project / "checkpoints"
    # Whatever the kill interrupted, the committed snapshots are whole (a temporary directory
    # may be left: readers skip it and the next writer removes it).
    committed = [n for n in os.listdir(root) if not n.startswith(".")]
    assert committed and set(committed) <= {"checkpoint_0", "checkpoint_1"}, committed
    for name in committed:
        assert tsnap.verify(root / name) == []
    child = run_child(tmp_path, "resume", project, resumed)
    assert child.returncode == 0, child.stderr[-2000:]
    reference, before, after = (read_losses(p) for p in (f"{resumed}.ref", killed, resumed))
    assert len(reference) == EPOCHS * 5 and len(before) == 2 * 5
    assert min(after) in ("1:0", "2:0"), sorted(after)
    for key, loss in (before | after).items():
        assert loss == reference[key], (key, loss, reference[key])
    assert max(after) == f"{EPOCHS - 1}:4"
    assert not [n for n in os.listdir(root) if n.startswith(".")]  # the next writer cleaned up


class Big:
    """A registered object whose state grows past the disk."""

    def __init__(self):
        self.t = torch.zeros(1)

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, sd):
        self.t = sd["t"]


def test_disk_full_fails_the_save_and_keeps_the_previous(tiny_disk):
    acc, *_ = setup(tiny_disk, total_limit=1)
    big = Big()
    acc.register_for_checkpointing(big)
    first = tsnap.accelerate.save_state(acc)
    tsnap.accelerate.wait(acc)
    big.t = torch.randn(1 << 20)  # 4 MiB on a 2 MiB disk
    tsnap.accelerate.save_state(acc)  # total_limit=1: checkpoint_0's removal waits for it
    with pytest.warns(RuntimeWarning, match="kept"):
        with pytest.raises(tsnap.IoError, match=r"checkpoint_1 failed \(ENOSPC\)") as failure:
            tsnap.accelerate.wait(acc)
    assert failure.value.errno == errno.ENOSPC
    root = tiny_disk / "checkpoints"
    assert sorted(os.listdir(root)) == ["checkpoint_0"]
    assert tsnap.verify(first) == []
    big.t = torch.zeros(1)
    assert tsnap.accelerate.load_state(acc) == first
    tsnap.accelerate.checkpointer(acc).close()
