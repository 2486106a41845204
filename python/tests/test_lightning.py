"""tsnap.lightning: Lightning's Trainer and Fabric saving and loading through TsnapCheckpointIO."""

import collections
import math
import os
import threading
import warnings

import pytest
import torch

pytest.importorskip("lightning")

import lightning.pytorch as pl  # noqa: E402
from lightning.fabric import Fabric  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

import tsnap  # noqa: E402
from tsnap.lightning import TsnapCheckpointIO  # noqa: E402

STEPS_PER_EPOCH = 3  # 24 samples, batches of 8


def bits_equal(a, b):
    assert isinstance(b, torch.Tensor), type(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def assert_same(a, b, where="checkpoint"):
    """Equal values of equal types (OrderedDict vs dict, tuple vs list, int vs float)."""
    if isinstance(a, torch.Tensor):
        assert bits_equal(a, b), where
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and isinstance(a, collections.OrderedDict) == isinstance(
            b, collections.OrderedDict), (where, type(a), type(b))
        assert list(a) == list(b), (where, set(a) ^ set(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
        return
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}/{i}")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, (where, a, b)


class Net(pl.LightningModule):
    def __init__(self, hidden=16, name="net", lrs=(0.1, 0.2), extra=None):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.BatchNorm1d(hidden),
                                       torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 2)}


def data():
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(24, 8, generator=g),
                                        torch.randn(24, 1, generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=8)


def trainer(max_steps, callbacks=(), plugins=()):
    return pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=bool(callbacks), callbacks=list(callbacks),
                      plugins=list(plugins))


def model(seed):
    torch.manual_seed(seed)
    return Net()


def checkpoints(dirpath):
    """The entries of a checkpoint directory (temporaries included: none may be left)."""
    return sorted(os.listdir(dirpath))


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*(num_workers|LeafSpec|litlogger|exists and is not empty).*")
        yield


def test_trainer_model_checkpoint_and_resume_from_last(tmp_path):
    # The reference: 4 epochs straight through, no checkpoints.
    ref = model(0)
    trainer(4 * STEPS_PER_EPOCH).fit(ref, data())

    # The same run, stopped after 2 epochs, with top-2 and last checkpoints every epoch's worth
    # of steps, then resumed from "last" by a new Trainer and a model built differently.
    dirpath = tmp_path / "ckpt"

    def callback():
        return ModelCheckpoint(dirpath=dirpath, save_top_k=2, monitor="train_loss",
                               save_last=True, every_n_train_steps=STEPS_PER_EPOCH)
    trainer(2 * STEPS_PER_EPOCH, [callback()], [TsnapCheckpointIO()]).fit(model(0), data())
    saved = checkpoints(dirpath)
    assert "last.ckpt" in saved and len(saved) == 3, saved
    for name in saved:
        path = dirpath / name
        assert path.is_dir() and not path.is_symlink()
        assert tsnap.verify(path) == []
    last = tsnap.load(dirpath / "last.ckpt")
    assert last["global_step"] == 2 * STEPS_PER_EPOCH and last["epoch"] == 1
    assert tsnap.metadata(dirpath / "last.ckpt")["step"] == 2 * STEPS_PER_EPOCH
    assert tsnap.latest(dirpath) is not None

    resumed = model(1)
    t = trainer(4 * STEPS_PER_EPOCH, [callback()], [TsnapCheckpointIO()])
    t.fit(resumed, data(), ckpt_path="last")
    assert t.global_step == 4 * STEPS_PER_EPOCH
    for (k, a), b in zip(ref.state_dict().items(), resumed.state_dict().values()):
        assert bits_equal(a, b), k
    saved = checkpoints(dirpath)
    assert len(saved) == 3, saved  # the top-2 kept and replaced, last overwritten in place
    assert tsnap.load(dirpath / "last.ckpt")["global_step"] == 4 * STEPS_PER_EPOCH


def test_lightning_checkpoint_round_trip(tmp_path):
    t = trainer(STEPS_PER_EPOCH + 1,
                [ModelCheckpoint(dirpath=tmp_path / "mc", monitor="train_loss", save_top_k=2,
                                 every_n_train_steps=2)])
    t.fit(Net(extra={"tags": ["a", None], "big": 2**70, "ratio": float("inf")}), data())
    ckpt = t._checkpoint_connector.dump_checkpoint()
    # The precision plugin's scaler state, as 16-mixed on a GPU records it.
    ckpt["MixedPrecision"] = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                              "growth_interval": 2000, "_growth_tracker": 3}
    ckpt["extra"] = {1: (torch.arange(3), "x"), "dtype": torch.bfloat16, "nan": float("nan")}
    assert ckpt["state_dict"]._metadata  # module versions, as torch.save keeps them

    io = TsnapCheckpointIO()
    path = tmp_path / "one" / "epoch=1-step=4.ckpt"
    io.save_checkpoint(ckpt, path)
    got = io.load_checkpoint(path)  # waits for the save in flight
    assert_same(ckpt, got)
    assert got["state_dict"]._metadata == ckpt["state_dict"]._metadata
    assert tsnap.verify(path) == []
    model = Net()
    model.load_state_dict(got["state_dict"])
    io.teardown()

    # bf16 weights on request; counters and scalars keep their dtype.
    io = TsnapCheckpointIO(dtype=torch.bfloat16)
    io.save_checkpoint(ckpt, tmp_path / "bf16.ckpt")
    io.teardown()
    got = io.load_checkpoint(tmp_path / "bf16.ckpt", map_location="cpu")
    assert got["state_dict"]["net.0.weight"].dtype == torch.bfloat16
    assert got["state_dict"]["net.1.num_batches_tracked"].dtype == torch.int64
    assert got["optimizer_states"][0]["state"][0]["step"].dtype == torch.float32


def test_fabric_save_load(tmp_path):
    io = TsnapCheckpointIO()
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[io])
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    module, optimizer = fabric.setup(module, optimizer)
    for _ in range(2):
        loss = module(torch.randn(3, 4)).square().sum()
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    plain = {"step": 2, "lr": 0.01, "names": ["a", None, 3], "nested": {"k": (1, 2.5)},
             "big": -(2**80), "inf": float("-inf")}
    path = tmp_path / "fabric" / "step-2.ckpt"
    fabric.save(path, {"model": module, "optimizer": optimizer, **plain})
    assert io.in_flight in ([], [str(path)])

    torch.manual_seed(1)
    module2 = torch.nn.Linear(4, 2)
    optimizer2 = torch.optim.Adam(module2.parameters(), lr=0.5)
    module2, optimizer2 = fabric.setup(module2, optimizer2)
    state = {"model": module2, "optimizer": optimizer2, "step": 0}
    remainder = fabric.load(path, state)  # waits for the save in flight
    assert state["step"] == 2
    assert_same({k: v for k, v in plain.items() if k != "step"}, remainder)
    for a, b in zip(module.parameters(), module2.parameters()):
        assert bits_equal(a.detach(), b.detach())
    assert_same(optimizer.state_dict(), optimizer2.state_dict())
    io.teardown()
    assert tsnap.verify(path) == []


class Gate:
    """Holds the handles of the saves started while it is closed: done() is False and wait()
    blocks until it opens (then the real handle is waited for, or the injected error raised)."""

    def __init__(self, monkeypatch):
        self.open_ = threading.Event()
        self.open_.set()
        self.fail = False
        real = tsnap.Snapshotter.save_async
        gate = self

        def save_async(snap, *args, **kwargs):
            return Gated(real(snap, *args, **kwargs), gate, not gate.open_.is_set())
        monkeypatch.setattr(tsnap.Snapshotter, "save_async", save_async)

    def close(self, fail=False):
        self.open_.clear()
        self.fail = fail

    def open(self):
        self.open_.set()


class Gated:
    def __init__(self, handle, gate, held):
        self.handle, self.gate, self.held = handle, gate, held

    def done(self):
        return (not self.held or self.gate.open_.is_set()) and self.handle.done()

    def wait(self, timeout=None):
        if self.held:
            self.gate.open_.wait()
            self.handle.wait()
            if self.gate.fail:
                raise tsnap._errors.error("io", f"injected failure of {self.handle.path}")
        return self.handle.wait(timeout)


def state(value):
    return {"state_dict": {"w": torch.full((256, 256), float(value))}, "global_step": value}


def test_remove_checkpoint_while_saving(tmp_path, monkeypatch):
    gate = Gate(monkeypatch)
    io = TsnapCheckpointIO()
    a, b, c = (tmp_path / f"{n}.ckpt" for n in "abc")
    io.save_checkpoint(state(1), a)
    io.wait()

    gate.close()
    io.save_checkpoint(state(2), b)  # in flight until the gate opens
    io.save_checkpoint(state(3), c)
    io.remove_checkpoint(a)          # the newest committed one: kept while b, c are in flight
    io.remove_checkpoint(c)          # being written: removed once committed
    assert a.is_dir()  # (c may be committed already: the gate holds only its handle)
    assert io.in_flight == [str(b), str(c)]
    gate.open()
    io.wait()
    assert checkpoints(tmp_path) == ["b.ckpt"]
    assert tsnap.load(b)["global_step"] == 2

    # A save of a path whose removal is queued supersedes the removal.
    gate.close()
    io.save_checkpoint(state(4), c)
    io.remove_checkpoint(b)
    io.save_checkpoint(state(5), b)
    gate.open()
    io.teardown()
    assert checkpoints(tmp_path) == ["b.ckpt", "c.ckpt"]
    assert tsnap.load(b)["global_step"] == 5

    # A save that fails: the removals that waited for it are dropped, teardown raises it.
    gate.close(fail=True)
    io.save_checkpoint(state(6), a)
    io.remove_checkpoint(b)
    gate.open()
    with pytest.warns(RuntimeWarning, match="kept"), pytest.raises(tsnap.IoError,
                                                                   match="injected"):
        io.teardown()
    assert b.is_dir()
    io.teardown()  # raised once


def test_remove_while_a_real_save_writes(tmp_path):
    io = TsnapCheckpointIO()
    big = {"state_dict": {"w": torch.randn(4 << 20)}, "global_step": 1}  # 16 MiB
    io.save_checkpoint(big, tmp_path / "x.ckpt")
    io.remove_checkpoint(tmp_path / "x.ckpt")
    io.save_checkpoint(big, tmp_path / "y.ckpt")
    io.teardown()
    assert checkpoints(tmp_path) == ["y.ckpt"]
    assert tsnap.verify(tmp_path / "y.ckpt") == []
    io.remove_checkpoint(tmp_path / "y.ckpt")
    io.remove_checkpoint(tmp_path / "missing.ckpt")
    assert os.listdir(tmp_path) == []


def test_load_waits_for_the_save_of_its_path(tmp_path, monkeypatch):
    gate = Gate(monkeypatch)
    io = TsnapCheckpointIO()
    gate.close()
    io.save_checkpoint(state(7), tmp_path / "s.ckpt")
    threading.Timer(0.2, gate.open).start()
    assert io.load_checkpoint(tmp_path / "s.ckpt")["global_step"] == 7
    io.teardown()


def test_unsupported_value_names_its_key(tmp_path):
    io = TsnapCheckpointIO()
    ckpt = {"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"cfg": object()}}
    with pytest.raises(tsnap.InvalidArgument, match="'hyper_parameters/cfg'"):
        io.save_checkpoint(ckpt, tmp_path / "bad.ckpt")
    with pytest.raises(tsnap.InvalidArgument, match="storage_options"):
        io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "x.ckpt", storage_options={})
    assert os.listdir(tmp_path) == []

    # Through the Trainer: a hyper-parameter tsnap cannot hold stops fit at the first save.
    cb = ModelCheckpoint(dirpath=tmp_path / "t", every_n_train_steps=1)
    with pytest.raises(tsnap.InvalidArgument, match="'hyper_parameters/extra'"):
        trainer(2, [cb], [TsnapCheckpointIO()]).fit(Net(extra=object()), data())


def test_load_errors(tmp_path):
    io = TsnapCheckpointIO()
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "none.ckpt")
    torch.save({"w": torch.ones(2)}, tmp_path / "torch.ckpt")
    with pytest.raises(tsnap.FormatError, match="not a tsnap snapshot"):
        io.load_checkpoint(tmp_path / "torch.ckpt")
    # Replacing a file that is not a snapshot is refused, and the file is kept.
    with pytest.raises(tsnap.Error, match="not a tsnap snapshot"):
        io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "torch.ckpt")
    assert (tmp_path / "torch.ckpt").is_file()
    io.teardown()
