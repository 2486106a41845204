"""tsnap.lightning: Lightning's Trainer and Fabric saving and loading through TsnapCheckpointIO."""

import argparse
import collections
import enum
import errno
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

pytest.importorskip("lightning")
np = pytest.importorskip("numpy")

import child_run  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
from child_run import read_losses  # noqa: E402
from compare import assert_same, bits_equal  # noqa: E402
from lightning.fabric import Fabric  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

import tsnap  # noqa: E402
import tsnap.lightning  # noqa: E402
from tsnap.lightning import TsnapCheckpointIO  # noqa: E402

STEPS_PER_EPOCH = 3  # 24 samples, batches of 8


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
    assert_same(ckpt, got, types=True)
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


def test_first_save_takes_the_memory_reserved_at_the_first_step(tmp_path):
    tsnap.reserve_staging(0)
    io = TsnapCheckpointIO()
    net = Net()
    opt = torch.optim.AdamW(net.parameters())

    def step():
        net.net(torch.randn(4, 8)).sum().backward()
        opt.step()

    assert tsnap.reserved_staging_bytes() == 0
    step()  # the state is known now: its staging memory is reserved
    assert tsnap.reserved_staging_bytes() >= 2 * (16 << 20)
    ckpt = {"state_dict": net.state_dict(), "optimizer_states": [opt.state_dict()],
            "global_step": 1}
    io.save_checkpoint(ckpt, tmp_path / "a.ckpt")
    assert tsnap.reserved_staging_bytes() == 0  # the first save's pool took it
    assert_same(io.load_checkpoint(tmp_path / "a.ckpt"), ckpt)
    io.teardown()
    # Armed again by teardown; a reservation no save took is released by the next teardown.
    step()
    assert tsnap.reserved_staging_bytes() > 0
    io.teardown()
    assert tsnap.reserved_staging_bytes() == 0


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
    assert_same({k: v for k, v in plain.items() if k != "step"}, remainder, types=True)
    for a, b in zip(module.parameters(), module2.parameters()):
        assert bits_equal(a.detach(), b.detach())
    assert_same(optimizer.state_dict(), optimizer2.state_dict(), types=True)
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


# -- values beyond JSON, load helpers ----------------------------------------------------------

class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


class HNet(Net):
    """A module built from an argparse.Namespace, as scripts with argparse do."""

    def __init__(self, args=None, **kwargs):
        pl.LightningModule.__init__(self)
        # Built again from the stored hyper-parameters: a dict of them, or them as keywords.
        args = argparse.Namespace(**(args if isinstance(args, dict) else kwargs)) \
            if args is None or isinstance(args, dict) else args
        self.save_hyperparameters(args)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, args.hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(args.hidden, 1))


def rich_values():
    return {
        "args": argparse.Namespace(lr=0.1, out=pathlib.Path("/runs/a"), inner=argparse.Namespace(
            tags={"b", "a"})),
        "path": pathlib.PurePosixPath("data/train"),
        "np_float": np.float32(0.1), "np_int": np.int64(-3), "np_bool": np.bool_(True),
        "np_double": np.float64(1 / 3), "np_array": np.arange(6, dtype=np.float16).reshape(2, 3),
        "np_empty": np.zeros((0, 2), dtype=np.uint8), "np_str": np.array(["x", "yz"]),
        "set": {3, 1, 2}, "frozen": frozenset({("a", 1)}), "bytes": b"\x00\xffab",
        "bytearray": bytearray(b"xy"), "counter": collections.Counter("abracadabra"),
        "counter_of_tuples": collections.Counter({(1, "a"): 2}),
        "ordered": collections.OrderedDict([("z", 1), ("a", {2})]),
        "default": collections.defaultdict(list, {"k": [1, 2]}),
        "mode": Mode.SLOW, "modes": (Mode.FAST, pathlib.Path("p")),
        "cls": HNet, "builtin": int, "dtype": torch.float16,
    }


def assert_same_values(a, b, where="values"):
    """Equal values of equal types, numpy ones included."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all(), where
    elif isinstance(a, argparse.Namespace):
        assert_same_values(vars(a), vars(b), where)
    elif isinstance(a, dict):
        assert list(a) == list(b), (where, list(a), list(b))
        if isinstance(a, collections.defaultdict):
            assert a.default_factory is b.default_factory, where
        for k in a:
            assert_same_values(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_values(x, y, f"{where}/{i}")
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a == b, (where, a, b)
    else:
        assert a == b, (where, a, b)


def test_values_beyond_json_round_trip(tmp_path):
    values = rich_values()
    ckpt = {"state_dict": {"w": torch.ones(3)}, "global_step": 1, "hyper_parameters": values,
            "hparams_type": dict, "callbacks": {"Cb": {"seen": {"x", "y"}}}}
    io = TsnapCheckpointIO(import_types=["test_lightning.Mode", "test_lightning.HNet"])
    io.save_checkpoint(ckpt, tmp_path / "a.ckpt")
    got = io.load_checkpoint(tmp_path / "a.ckpt")
    io.teardown()
    assert ckpt["hyper_parameters"] is values and isinstance(values["args"], argparse.Namespace)
    assert got["hparams_type"] is dict and got["callbacks"] == {"Cb": {"seen": {"x", "y"}}}
    assert_same_values(values, got["hyper_parameters"])
    assert tsnap.verify(tmp_path / "a.ckpt") == []

    # By default a load imports nothing: the enum members and the class come back as
    # placeholders naming themselves; builtins and standard classes are restored.
    got = tsnap.lightning.load(tmp_path / "a.ckpt")["hyper_parameters"]
    assert got["builtin"] is int and isinstance(got["counter"], collections.Counter)
    mode = got["mode"]
    assert isinstance(mode, tsnap.lightning.Unresolved) and mode.kind == "enum"
    assert (mode.name, mode.member, mode.value) == ("test_lightning.Mode", "SLOW", "slow")
    assert mode.key == "hyper_parameters/mode" and "import_types" in repr(mode) + mode.message()
    assert isinstance(got["modes"][0], tsnap.lightning.Unresolved)
    assert got["modes"][1] == pathlib.Path("p")
    with pytest.raises(tsnap.Error, match="'hyper_parameters/cls'.*import_types"):
        got["cls"]()
    got = tsnap.lightning.load(tmp_path / "a.ckpt", import_types=True)["hyper_parameters"]
    assert got["mode"] is Mode.SLOW and got["cls"] is HNet


def test_values_that_stay_refused(tmp_path):
    class Local:
        pass
    io = TsnapCheckpointIO()
    for value, match in ((collections.defaultdict(lambda: 0), "default_factory"),
                         (np.zeros(3, dtype=np.complex64), "complex64"),
                         (np.zeros(5000), "5000 element"),
                         ({"local": Local}, "Local.*no importable qualified name"),
                         ({(1, 2): "tuple key"}, "dict key"),
                         (argparse.Namespace(f=object()), "'hyper_parameters/v/f'")):
        ckpt = {"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"v": value}}
        with pytest.raises(tsnap.InvalidArgument, match=match):
            io.save_checkpoint(ckpt, tmp_path / "x.ckpt")
    io.teardown()
    assert os.listdir(tmp_path) == []


def test_namespace_hparams_and_load_from_checkpoint(tmp_path):
    args = argparse.Namespace(hidden=4, mode=Mode.FAST, root=pathlib.Path("/data"),
                              scale=np.float32(0.5), labels=frozenset({"a", "b"}))
    module = HNet(args)
    cb = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer(2, [cb], [TsnapCheckpointIO()]).fit(module, data())
    path = tmp_path / "epoch=0-step=2.ckpt"
    ckpt = tsnap.lightning.load(path, import_types=["test_lightning.Mode"])
    assert_same_values(vars(args), dict(ckpt["hyper_parameters"]))

    # Lightning's own load_from_checkpoint reads the path with torch.load: it cannot.
    with pytest.raises(Exception):  # noqa: B017 (IsADirectoryError or an unpickling error)
        HNet.load_from_checkpoint(path)
    # The enum member is not imported unless allowed: refused, naming the key and the option.
    with pytest.raises(tsnap.Error, match="'hyper_parameters/mode'.*import_types"):
        tsnap.lightning.load_from_checkpoint(HNet, path)
    loaded = tsnap.lightning.load_from_checkpoint(HNet, path,
                                                  import_types=["test_lightning.Mode"])
    assert isinstance(loaded, HNet) and loaded.hparams.mode is Mode.FAST
    assert isinstance(loaded.hparams.root, pathlib.PosixPath)
    for (k, a), b in zip(module.state_dict().items(), loaded.state_dict().values()):
        assert bits_equal(a, b), k
    # kwargs override the stored hyper-parameters; loading stays strict.
    with pytest.raises(RuntimeError, match="Missing key"):
        tsnap.lightning.load_from_checkpoint(Net, path, hidden=4, import_types=True)

    # Net, saved with plain hyper-parameters, built from them.
    net_path = tmp_path / "net"
    t = trainer(1, [ModelCheckpoint(dirpath=net_path, every_n_train_steps=1)],
                [TsnapCheckpointIO()])
    net = Net(hidden=8, lrs=(0.5,))
    t.fit(net, data())
    loaded = tsnap.lightning.load_from_checkpoint(Net, next(net_path.iterdir()))
    assert loaded.hparams.hidden == 8 and loaded.hparams.lrs == (0.5,)
    assert all(bits_equal(a, b) for a, b in zip(net.state_dict().values(),
                                                 loaded.state_dict().values()))


# -- the same checkpoint twice in one step -------------------------------------------------------

def shard_inodes(path):
    return {os.stat(p).st_ino for p in pathlib.Path(path).glob("*.safetensors")}


def test_last_and_top_k_of_one_step_share_files(tmp_path):
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="train_loss", save_top_k=1, save_last=True,
                         every_n_train_steps=STEPS_PER_EPOCH)
    # One save writing at a time: the last.ckpt of step 3 cannot commit after the top-k
    # checkpoint of step 6 and become the base of the last.ckpt of step 6 (docs/lightning.md).
    io = TsnapCheckpointIO(max_in_flight=1)
    trainer(2 * STEPS_PER_EPOCH, [cb], [io]).fit(model(0), data())
    saved = checkpoints(tmp_path)
    assert "last.ckpt" in saved and len(saved) == 2, saved
    top = next(n for n in saved if n != "last.ckpt")
    last = tsnap.load(tmp_path / "last.ckpt")
    assert last["global_step"] == tsnap.load(tmp_path / top)["global_step"]
    assert shard_inodes(tmp_path / "last.ckpt") == shard_inodes(tmp_path / top)
    assert tsnap.verify(tmp_path / "last.ckpt") == []
    assert_same(tsnap.load(tmp_path / top)["state_dict"], last["state_dict"], types=True)

    # At the plugin: the second save of one step writes only headers and a manifest; a save
    # after a change, or of another step, writes the bytes again.
    io = TsnapCheckpointIO()
    big = {"state_dict": {"w": torch.randn(1 << 20)}, "global_step": 5}
    io.save_checkpoint(big, tmp_path / "p" / "a.ckpt")
    io.save_checkpoint(dict(big, extra="last"), tmp_path / "p" / "last.ckpt")
    written = io._saves._saves[-1].handle  # the newest save (the plugin's tracker)
    io.wait()
    assert written.stats.written_bytes < 64 << 10 and written.stats.linked_bytes >= 4 << 20
    big["state_dict"]["w"].add_(1)
    io.save_checkpoint(big, tmp_path / "p" / "b.ckpt")
    written = io._saves._saves[-1].handle  # the newest save (the plugin's tracker)
    io.teardown()
    assert written.stats.written_bytes >= 4 << 20
    assert tsnap.lightning.load(tmp_path / "p" / "last.ckpt")["extra"] == "last"


# -- crashes, a full disk, an exit without teardown ----------------------------------------------

CHILD = r"""
import os, sys
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
import test_lightning as T
from tsnap.lightning import TsnapCheckpointIO

mode, dirpath, losses = sys.argv[1:4]


class Record(pl.Callback):
    def __init__(self, path):
        self.path = path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        with open(self.path, "a") as f:
            f.write(f"{{trainer.global_step}} {{outputs['loss'].item().hex()}}\n")


class KillAfterSave(ModelCheckpoint):
    def on_train_batch_end(self, trainer, *args):
        super().on_train_batch_end(trainer, *args)
        if mode == "kill" and trainer.global_step == 2 * T.STEPS_PER_EPOCH:
            os.kill(os.getpid(), 9)   # the save of this step may still be in flight


def callback():
    return KillAfterSave(dirpath=dirpath, save_last=True, save_top_k=-1,
                         every_n_train_steps=T.STEPS_PER_EPOCH)


with T.warnings.catch_warnings():
    T.warnings.simplefilter("ignore")
    steps = 4 * T.STEPS_PER_EPOCH
    if mode == "kill":
        T.trainer(steps, [Record(losses), callback()], [TsnapCheckpointIO()]).fit(
            T.model(0), T.data())
    else:
        T.trainer(steps, [Record(losses), callback()], [TsnapCheckpointIO()]).fit(
            T.model(1), T.data(), ckpt_path="last")
        pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                   enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, callbacks=[Record(losses + ".ref")]).fit(
            T.model(0), T.data())
"""


def run_child(tmp_path, *args):
    return child_run.run_child(tmp_path, CHILD, *args)


def test_kill_9_mid_run_then_resume_from_last(tmp_path):
    dirpath, killed, resumed = tmp_path / "ckpt", tmp_path / "killed", tmp_path / "resumed"
    child = run_child(tmp_path, "kill", dirpath, killed)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    # Whatever the kill interrupted, the committed snapshots are whole (a temporary directory
    # may be left: readers skip it and the next writer removes it).
    committed = [n for n in os.listdir(dirpath) if not n.startswith(".")]
    assert "last.ckpt" in committed
    for name in committed:
        assert tsnap.verify(dirpath / name) == []
    child = run_child(tmp_path, "resume", dirpath, resumed)
    assert child.returncode == 0, child.stderr[-2000:]
    assert not [n for n in os.listdir(dirpath) if n.startswith(".")]  # cleaned up
    reference = read_losses(f"{resumed}.ref")
    before, after = read_losses(killed), read_losses(resumed)
    assert len(reference) == 4 * STEPS_PER_EPOCH and len(before) == 2 * STEPS_PER_EPOCH
    assert min(map(int, after)) in (STEPS_PER_EPOCH + 1, 2 * STEPS_PER_EPOCH + 1), after
    for step, loss in (before | after).items():
        assert loss == reference[step], (step, loss, reference[step])
    assert max(map(int, after)) == 4 * STEPS_PER_EPOCH


def test_disk_full_fails_the_save_and_keeps_the_previous(tiny_disk):
    io = TsnapCheckpointIO()
    io.save_checkpoint(state(1), tiny_disk / "a.ckpt")  # 256 KiB
    io.wait()
    big = {"state_dict": {"w": torch.randn(1 << 20)}, "global_step": 2}  # 4 MiB
    io.save_checkpoint(big, tiny_disk / "b.ckpt")
    io.remove_checkpoint(tiny_disk / "a.ckpt")  # queued behind the save that fails: dropped
    with pytest.warns(RuntimeWarning, match="kept"):
        while io.in_flight:
            time.sleep(0.01)
    # The next save raises the failure, naming the checkpoint and ENOSPC, and does not start.
    with pytest.raises(tsnap.IoError, match=r"b\.ckpt failed \(ENOSPC\)") as failure:
        io.save_checkpoint(state(3), tiny_disk / "c.ckpt")
    assert failure.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tiny_disk)) == ["a.ckpt"]
    assert tsnap.lightning.load(tiny_disk / "a.ckpt")["global_step"] == 1
    io.teardown()


EXIT_CHILD = r"""
import sys, torch
from tsnap.lightning import TsnapCheckpointIO
io = TsnapCheckpointIO()
for path in sys.argv[1:]:
    io.save_checkpoint({"state_dict": {"w": torch.randn(1 << 20)}, "global_step": 1}, path)
# no teardown(), as with Fabric: the saves complete (or report) at interpreter exit
"""


def test_saves_complete_at_exit_without_teardown(tmp_path, request):
    paths = [tmp_path / "ok" / "a.ckpt"]
    disk = None
    if os.geteuid() == 0:
        disk = request.getfixturevalue("tiny_disk")
        paths.append(disk / "full.ckpt")
    child = subprocess.run([sys.executable, "-c", EXIT_CHILD, *map(str, paths)],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert child.returncode == 0, child.stderr[-2000:]
    assert tsnap.verify(paths[0]) == []
    assert tsnap.lightning.load(paths[0])["global_step"] == 1
    if disk is not None:
        assert "at interpreter exit" in child.stderr and "ENOSPC" in child.stderr, child.stderr
        assert os.listdir(disk) == []


class ConfNet(Net):
    """A module whose hyper-parameters are an omegaconf DictConfig."""

    def __init__(self, cfg=None, **kwargs):
        pl.LightningModule.__init__(self)
        from omegaconf import OmegaConf
        cfg = OmegaConf.create(kwargs if cfg is None else cfg)
        self.save_hyperparameters(cfg)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, cfg.hidden),
                                       torch.nn.Linear(cfg.hidden, 1))


def test_omegaconf_hyperparameters(tmp_path):
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"hidden": 3, "opt": {"lr": 0.1, "betas": [0.9, 0.99]},
                                      "ref": "${hidden}"})
    ckpt = {"state_dict": {"w": torch.ones(1)}, "global_step": 1, "hyper_parameters": cfg,
            "hparams_type": type(cfg), "more": omegaconf.ListConfig([1, {"a": None}])}
    io = TsnapCheckpointIO()
    io.save_checkpoint(ckpt, tmp_path / "a.ckpt")
    got = io.load_checkpoint(tmp_path / "a.ckpt")
    io.teardown()
    assert isinstance(got["hyper_parameters"], omegaconf.DictConfig)
    assert got["hparams_type"] is omegaconf.DictConfig
    assert omegaconf.OmegaConf.to_container(got["hyper_parameters"]) == \
        omegaconf.OmegaConf.to_container(cfg)  # interpolations kept unresolved
    assert got["hyper_parameters"].ref == 3
    assert isinstance(got["more"], omegaconf.ListConfig) and list(got["more"])[0] == 1

    module = ConfNet(hidden=2)
    trainer(1, [ModelCheckpoint(dirpath=tmp_path / "t", every_n_train_steps=1)],
            [TsnapCheckpointIO()]).fit(module, data())
    loaded = tsnap.lightning.load_from_checkpoint(ConfNet, next((tmp_path / "t").iterdir()))
    assert loaded.hparams.hidden == 2
    assert all(bits_equal(a, b) for a, b in zip(module.state_dict().values(),
                                                 loaded.state_dict().values()))


# -- sharded: TsnapModelParallelStrategy (FSDP2) on 2 Gloo ranks ---------------------------------

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightning_worker.py")


def run_ranks(world, *args, timeout=90):
    """Runs ``world`` ranks of lightning_worker.py (torchrun's variables set); kills them all and
    fails when one fails or time runs out."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, WORKER, *map(str, args)], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
        for r in range(world)]
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
    outputs = [p.communicate()[0] for p in procs]
    for rank, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank} (rc {p.returncode}):\n{text[-3000:]}"


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """2 ranks: an FSDP2 run of 6 steps with a checkpoint every 2 steps, then a new model
    resumed from step 4 to step 6; (checkpoint dir, output dir: train.pt, the whole state after
    step 4, resume.pt, the resumed one's, and their losses)."""
    root = tmp_path_factory.mktemp("sharded")
    ckpt, out = root / "ckpt", root / "out"
    out.mkdir()
    run_ranks(2, "train", ckpt, out)
    return ckpt, out


def step_4(ckpt):
    return ckpt / "epoch=0-step=4.ckpt"


@pytest.mark.dist
def test_sharded_checkpoint_resumes_the_loss_curve_on_two_ranks(sharded_run):
    ckpt, out = sharded_run
    assert checkpoints(ckpt) == [f"epoch={s // 5}-step={s}.ckpt" for s in (2, 4, 6)]
    for name in checkpoints(ckpt):
        assert tsnap.verify(ckpt / name) == []
        with open(ckpt / name / "MANIFEST.json") as f:
            assert json.load(f)["world_size"] == 2  # one snapshot, each rank its pieces
    assert_same(torch.load(out / "train.pt"), torch.load(out / "resume.pt"))
    for rank in (0, 1):
        reference, after = (read_losses(out / f"{m}-losses-{rank}") for m in ("train", "resume"))
        assert sorted(after) == ["5", "6"]
        assert after == {s: reference[s] for s in after}  # bit for bit


@pytest.mark.dist
def test_sharded_checkpoint_resumes_on_one_process_bit_for_bit(sharded_run, tmp_path):
    ckpt, out = sharded_run
    reference = torch.load(out / "train.pt")
    # One process reads the whole tensors, assembled from the ranks' pieces.
    whole = tsnap.lightning.load(step_4(ckpt))
    assert whole["global_step"] == 4
    assert_same(reference["model"], whole["state_dict"])
    # Lightning on 1 process (a mesh of 1) restores the model and the optimizer exactly.
    run_ranks(1, "resume", ckpt, tmp_path, step_4(ckpt))
    assert_same(reference, torch.load(tmp_path / "resume.pt"))
    assert sorted(read_losses(tmp_path / "resume-losses-0")) == ["5", "6"]


def test_sharded_strategy_refuses_a_gathered_checkpoint():
    with pytest.raises(tsnap.InvalidArgument, match="save_distributed_checkpoint"):
        tsnap.lightning.TsnapModelParallelStrategy(save_distributed_checkpoint=False)
