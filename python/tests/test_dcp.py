"""tsnap.dcp: torch.distributed.checkpoint (DCP) saves and loads through tsnap snapshots."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp
from compare import assert_same, bits_equal
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

import tsnap
import tsnap.dcp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def trained(seed):
    """A model and an AdamW optimizer after one step (moments, step counters, param groups)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3 * (seed + 1), betas=(0.9, 0.95))
    model(torch.randn(8, 16)).square().mean().backward()
    opt.step()
    return model, opt


def app_state(seed):
    model, opt = trained(seed)
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "extra": {"step": 100 + seed, "name": f"run-{seed}", "lrs": [0.1, 0.01 * seed],
                  "rng": torch.Generator().manual_seed(seed).get_state(),
                  "scale": torch.tensor(2.0 ** seed), "mask": torch.rand(5) > 0.5,
                  "ids": torch.arange(6, dtype=torch.int32).reshape(2, 3) * seed,
                  "half": torch.randn(3, 7).to(torch.bfloat16), "empty": torch.zeros(0, 3)},
    }


def clone(state):
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return type(state)((k, clone(v)) for k, v in state.items())
    if isinstance(state, list):
        return [clone(v) for v in state]
    return state


def test_save_load_round_trip_is_bitwise(tmp_path):
    path = tmp_path / "ckpt" / "step-100"
    saved = app_state(0)
    expected = clone(saved)
    dcp.save(saved, storage_writer=tsnap.dcp.StorageWriter(path))

    # It is a committed tsnap snapshot, every chunk intact.
    assert tsnap.verify(path) == []
    assert tsnap.latest(tmp_path / "ckpt") == str(path)
    meta = tsnap.metadata(path)
    assert "extra.step" in meta["tsnap_dcp"]["bytes"]
    assert meta["tsnap_dcp"]["planner_data"]["optim.state.0.exp_avg"] == [
        "optim", "state", "0", "exp_avg"]
    # Its tensors are plain tensors under DCP's names: tsnap's own load reads them.
    flat = tsnap.load(path)
    assert bits_equal(flat["model.0.weight"], expected["model"]["0.weight"])
    assert flat["extra.step"].dtype == torch.uint8  # a non-tensor value: DCP's bytes

    # Load into a state of another run: every tensor and value comes back bit for bit.
    dest = app_state(1)
    dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(path))
    assert_same(expected, dest)


def test_load_without_a_template_rebuilds_the_nesting(tmp_path):
    # What DCP's dcp_to_torch_save does: the state is made from the metadata alone, nested by
    # DCP's planner data, which the manifest keeps.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    saved = app_state(0)
    dcp.save(saved, storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s"))
    out = {}
    _load_state_dict(out, storage_reader=tsnap.dcp.StorageReader(tmp_path / "s"),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    assert_same(saved["model"], out["model"])
    assert_same(saved["extra"], out["extra"])
    assert out["optim"]["param_groups"] == saved["optim"]["param_groups"]
    assert bits_equal(saved["optim"]["state"][0]["exp_avg"], out["optim"]["state"]["0"]["exp_avg"])


def test_load_into_a_model_and_optimizer(tmp_path):
    model, opt = trained(0)
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
             storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s"))
    model2, opt2 = trained(3)
    state = {"model": model2.state_dict(), "optim": opt2.state_dict()}
    dcp.load(state, storage_reader=tsnap.dcp.StorageReader(tmp_path / "s"))
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optim"])
    assert_same(model.state_dict(), model2.state_dict())
    assert_same(opt.state_dict(), opt2.state_dict())


def test_checkpoint_id_and_dtype_conversion_on_load(tmp_path):
    w = torch.randn(64, 33)
    writer = tsnap.dcp.StorageWriter(tmp_path / "unused")
    dcp.save({"w": w, "n": torch.arange(5)}, checkpoint_id=tmp_path / "a", storage_writer=writer)
    assert writer.checkpoint_id == str(tmp_path / "a") and not (tmp_path / "unused").exists()
    dest = {"w": torch.zeros(64, 33, dtype=torch.bfloat16), "n": torch.zeros(5, dtype=torch.int64)}
    dcp.load(dest, checkpoint_id=tmp_path / "a", storage_reader=tsnap.dcp.StorageReader("x"))
    assert torch.equal(dest["w"], w.to(torch.bfloat16)) and torch.equal(dest["n"], torch.arange(5))


def test_stored_in_bfloat16(tmp_path):
    state = {"w": torch.randn(128, 64), "n": torch.arange(7), "v": {"lr": 0.5}}
    dcp.save(state, storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s", dtype=torch.bfloat16))
    records = json.loads((tmp_path / "s" / "MANIFEST.json").read_text())["tensors"]
    assert records["w"]["dtype"] == "BF16" and records["w"]["source_dtype"] == "F32"
    assert records["n"]["dtype"] == "I64"
    dest = {"w": torch.zeros(128, 64), "n": torch.zeros(7, dtype=torch.int64), "v": {"lr": 0}}
    dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(tmp_path / "s"))
    assert torch.equal(dest["w"], state["w"].to(torch.bfloat16).float())
    assert torch.equal(dest["n"], state["n"]) and dest["v"] == {"lr": 0.5}


def test_async_save_round_trip_is_point_in_time(tmp_path):
    state = {"w": torch.randn(256, 1024), "step": torch.tensor(7), "meta": {"epoch": 2}}
    expected = clone(state)
    fut = dcp.async_save(state, storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s"))
    state["w"].add_(1.0)  # training goes on once DCP's stager has copied the state
    state["step"].add_(1)
    fut = getattr(fut, "upload_completion", fut)
    fut.result(timeout=120)
    assert tsnap.verify(tmp_path / "s") == []
    dest = {"w": torch.zeros(256, 1024), "step": torch.tensor(0), "meta": {"epoch": 0}}
    dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(tmp_path / "s"))
    assert_same(expected, dest)


def test_async_commit_returns_before_the_commit(tmp_path):
    state = {"w": torch.randn(512, 1024)}
    expected = clone(state)
    writer = tsnap.dcp.StorageWriter(tmp_path / "s", async_commit=True)
    dcp.save(state, storage_writer=writer)
    state["w"].zero_()  # staged already: the snapshot is the state at the call
    assert writer.wait(timeout=120)
    assert writer.handle.done() and writer.handle.path == str(tmp_path / "s")
    dest = {"w": torch.empty(512, 1024)}
    dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(tmp_path / "s"))
    assert_same(expected, dest)


def test_writers_share_a_snapshotter_per_root(tmp_path):
    for i in range(3):
        dcp.save({"w": torch.full((4,), float(i))},
                 storage_writer=tsnap.dcp.StorageWriter(tmp_path / f"step-{i}"))
    snaps = [s for s in tsnap.dcp._snapshotters.values() if s.root == str(tmp_path)]
    assert len(snaps) == 1
    tsnap.dcp.close_snapshotters()
    assert not tsnap.dcp._snapshotters
    assert sorted(os.listdir(tmp_path)) == ["step-0", "step-1", "step-2"]


def test_own_snapshotter(tmp_path):
    with tsnap.Snapshotter(tmp_path, chunk_bytes=1 << 20) as snap:
        dcp.save({"w": torch.randn(1000, 1000)},
                 storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s", snapshotter=snap))
        with pytest.raises(CheckpointException, match="root"):
            dcp.save({"w": torch.ones(2)},
                     storage_writer=tsnap.dcp.StorageWriter(tmp_path / "x" / "s",
                                                            snapshotter=snap))
    files = json.loads((tmp_path / "s" / "MANIFEST.json").read_text())["files"]
    assert all(f["chunk_bytes"] == 1 << 20 for f in files.values())


def test_overwrite(tmp_path):
    dcp.save({"w": torch.ones(3)}, storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s"))
    dcp.save({"w": torch.full((3,), 2.0)}, storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s"))
    assert torch.equal(tsnap.load(tmp_path / "s")["w"], torch.full((3,), 2.0))
    with pytest.raises(CheckpointException, match="exists"):
        dcp.save({"w": torch.zeros(3)},
                 storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s", overwrite=False))
    assert torch.equal(tsnap.load(tmp_path / "s")["w"], torch.full((3,), 2.0))
    # What is not a snapshot is never replaced: a checkpoint of DCP's own writer, say.
    dcp.save({"w": torch.ones(3)}, storage_writer=dcp.FileSystemWriter(tmp_path / "d"))
    before = sorted(os.listdir(tmp_path / "d"))
    with pytest.raises(CheckpointException, match="not a tsnap snapshot"):
        dcp.save({"w": torch.zeros(3)}, storage_writer=tsnap.dcp.StorageWriter(tmp_path / "d"))
    assert sorted(os.listdir(tmp_path / "d")) == before
    (tmp_path / "e").mkdir()  # an empty directory is fine
    dcp.save({"w": torch.zeros(3)}, storage_writer=tsnap.dcp.StorageWriter(tmp_path / "e"))
    assert tsnap.verify(tmp_path / "e") == []


class _FailingPlanner(DefaultSavePlanner):
    """Fails on the n-th item it resolves, after checking that nothing is at the final path."""

    def __init__(self, path, fail_at):
        super().__init__()
        self.path, self.fail_at, self.resolved = path, fail_at, 0

    def resolve_data(self, write_item):
        assert not os.path.exists(self.path), "the snapshot is visible before its commit"
        self.resolved += 1
        if self.resolved == self.fail_at:
            raise RuntimeError("injected failure")
        return super().resolve_data(write_item)


def test_nothing_is_visible_until_the_commit(tmp_path):
    path = tmp_path / "s"
    state = {f"t{i}": torch.randn(256, 256) for i in range(8)}
    # A save that fails half-way leaves nothing under its name, nor a temporary that looks
    # committed.
    with pytest.raises(CheckpointException, match="injected failure"):
        dcp.save(state, storage_writer=tsnap.dcp.StorageWriter(path),
                 planner=_FailingPlanner(path, fail_at=5))
    assert not path.exists() and tsnap.latest(tmp_path) is None

    # While a save runs, the final path is either absent or a complete, verified snapshot.
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if path.exists():
                seen.append(tsnap.verify(path))
                return
            seen.append(None)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        dcp.save(state, storage_writer=tsnap.dcp.StorageWriter(path, chunk_bytes=1 << 16),
                 planner=_FailingPlanner(path, fail_at=-1))
    finally:
        time.sleep(0.05)
        stop.set()
        watcher.join()
    assert seen and seen[0] is None and all(s in (None, []) for s in seen)

    # An overwrite that fails leaves the previous snapshot whole.
    with pytest.raises(CheckpointException):
        dcp.save({k: v + 1 for k, v in state.items()}, storage_writer=tsnap.dcp.StorageWriter(
            path), planner=_FailingPlanner(tmp_path / "nowhere", fail_at=3))
    assert tsnap.verify(path) == []
    assert_same(state, tsnap.load(path, flat=True))


def test_corrupt_snapshot_is_a_clear_error(tmp_path):
    path = tmp_path / "s"
    dcp.save({"w": torch.randn(1024, 64), "v": {"x": 3}},
             storage_writer=tsnap.dcp.StorageWriter(path))
    shard = next(p for p in path.iterdir() if p.suffix == ".safetensors")
    with open(shard, "r+b") as f:
        f.seek(8192)
        byte = f.read(1)
        f.seek(8192)
        f.write(bytes([byte[0] ^ 0xFF]))
    bad = tsnap.verify(path)
    assert len(bad) == 1 and bad[0]["problem"] == "hash mismatch"
    dest = {"w": torch.zeros(1024, 64), "v": {"x": 0}}
    with pytest.raises(CheckpointException) as e:
        dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(path))
    failure = e.value.failures[0][0]
    assert isinstance(failure, tsnap.FormatError) and "hash" in str(failure), failure

    # A manifest cut short is a tsnap.FormatError; one that is missing, an IoError.
    manifest = (path / "MANIFEST.json").read_bytes()
    (path / "MANIFEST.json").write_bytes(manifest[: len(manifest) // 2])
    with pytest.raises(CheckpointException, match="MANIFEST.json"):
        dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(path))
    with pytest.raises(tsnap.FormatError):
        tsnap.dcp.StorageReader(path).read_metadata()
    (path / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointException, match="MANIFEST.json"):
        dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(path))
    assert not tsnap.dcp.StorageReader.validate_checkpoint_id(path)
    with pytest.raises(CheckpointException, match="missing does not exist"):
        dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(tmp_path / "missing"))


def test_unsupported_dtype_fails_before_writing(tmp_path):
    with pytest.raises(CheckpointException, match="complex64"):
        dcp.save({"z": torch.zeros(3, dtype=torch.complex64)},
                 storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s"))
    assert not (tmp_path / "s").exists()


def test_missing_key_and_shape_mismatch_on_load(tmp_path):
    dcp.save({"w": torch.ones(4, 4)}, storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s"))
    with pytest.raises(CheckpointException, match="Missing key"):
        dcp.load({"w": torch.ones(4, 4), "b": torch.ones(2)},
                 storage_reader=tsnap.dcp.StorageReader(tmp_path / "s"))
    with pytest.raises(CheckpointException, match="Size mismatch"):
        dcp.load({"w": torch.ones(4, 5)}, storage_reader=tsnap.dcp.StorageReader(tmp_path / "s"))


def test_reads_a_snapshot_written_by_tsnap(tmp_path):
    w, n = torch.randn(10, 3), torch.arange(4)
    tsnap.save(tmp_path / "s", {"w": w, "n": n})
    dest = {"w": torch.zeros(10, 3), "n": torch.zeros(4, dtype=torch.int64)}
    dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(tmp_path / "s"))
    assert bits_equal(dest["w"], w) and bits_equal(dest["n"], n)


def test_reads_a_nested_snapshot_written_by_tsnap_under_dcps_dotted_names(tmp_path):
    # tsnap stores {"extra": {"uneven": u}} as "extra/uneven"; DCP flattens it to "extra.uneven".
    u, w = torch.randn(5, 3), torch.randn(4)
    tsnap.save(tmp_path / "s", {"extra": {"uneven": u}, "model": {"fc1.weight": w}})
    dest = {"extra": {"uneven": torch.zeros(5, 3)}, "model": {"fc1.weight": torch.zeros(4)}}
    dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(tmp_path / "s"))
    assert bits_equal(dest["extra"]["uneven"], u) and bits_equal(dest["model"]["fc1.weight"], w)


def test_cli_accepts_the_snapshot(tmp_path):
    # The tool that comes with the package (its console script), else the C++ build's.
    cli = os.path.join(os.path.dirname(sys.executable), "tsnap")
    if not os.access(cli, os.X_OK):
        cli = os.path.join(REPO, "build", "tsnap")
    if not os.access(cli, os.X_OK):
        pytest.skip("the tsnap CLI is not installed or built (build/tsnap)")
    dcp.save(app_state(0), storage_writer=tsnap.dcp.StorageWriter(tmp_path / "s"))
    for cmd in (["verify"], ["ls"], ["inspect"]):
        target = str(tmp_path) if cmd == ["ls"] else str(tmp_path / "s")
        out = subprocess.run([cli, *cmd, target], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, (cmd, out.stdout, out.stderr)


# ---------------------------------------------------------------------------------------------
# Several ranks: Gloo on CPU, processes spawned here.

WORKER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard, Replicate
    import tsnap, tsnap.dcp

    rank, world, port, path, mode = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                      sys.argv[4], sys.argv[5])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{port}")
    mesh = init_device_mesh("cpu", (world,))
    # 2-D meshes: (world, 1) to save, (1, world) to load.
    grid = init_device_mesh("cpu", (world, 1) if mode == "save" else (1, world),
                            mesh_dim_names=("a", "b"))

    def full():
        g = torch.Generator().manual_seed(0)
        return {"row": torch.randn(8, 6, generator=g), "col": torch.randn(5, 12, generator=g),
                "uneven": torch.randn(7, 3, generator=g), "rep": torch.randn(4, generator=g),
                "plain": torch.arange(10, dtype=torch.int64),
                "moment": torch.randn(9, 4, generator=g).to(torch.bfloat16),
                "grid": torch.randn(6, 10, generator=g), "tiny": torch.randn(1, 5, generator=g)}

    SAVE = {"row": [Shard(0)], "col": [Shard(1)], "uneven": [Shard(0)], "rep": [Replicate()],
            "moment": [Shard(0)], "grid": [Shard(0), Shard(1)], "tiny": [Shard(0)]}
    LOAD = {"row": [Shard(1)], "col": [Shard(0)], "uneven": [Replicate()], "rep": [Shard(0)],
            "moment": [Shard(1)], "grid": [Shard(0), Shard(1)], "tiny": [Shard(1)]}

    def state(placements, zero):
        out = {}
        for k, t in full().items():
            t = torch.zeros_like(t) if zero else t
            m = grid if k == "grid" else mesh
            out[k] = distribute_tensor(t, m, placements[k]) if k in placements else t
        return {"model": out, "step": 0 if zero else 42}

    # A tensor-parallel model and its AdamW state, as get_state_dict gives them (DTensors,
    # optimizer state keyed by parameter name), one step into training.
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, parallelize_module)
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def tp_model():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        m = parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        return m, torch.optim.AdamW(m.parameters(), lr=0.01)

    def full_of(sd):
        if isinstance(sd, dict):
            return {k: full_of(v) for k, v in sd.items()}
        return sd.full_tensor() if hasattr(sd, "full_tensor") else sd

    if mode == "fail":
        # Rank 1's planner fails while resolving its items, before tsnap has them: rank 1 tells
        # the group, so rank 0's save fails at once (not on the 60 s timeout) naming the error;
        # both ranks raise, nothing is committed.
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        class Failing(DefaultSavePlanner):
            def resolve_data(self, item):
                if rank == 1:
                    raise RuntimeError("injected failure")
                return super().resolve_data(item)

        group = tsnap.DistGroup(timeout=60.0, prefix="test/fail")
        try:
            dcp.save(state(SAVE, False), planner=Failing(),
                     storage_writer=tsnap.dcp.StorageWriter(path, group=group))
        except CheckpointException as e:
            print("FAILED_OK", rank, str(e).replace("\\n", " ")[-300:])
        dist.barrier()
        dist.destroy_process_group()
        print("RANK_OK", rank)
        sys.exit(0)

    if mode == "save":
        model, opt = tp_model()
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
        model(x).square().mean().backward()
        opt.step()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, storage_writer=tsnap.dcp.StorageWriter(path + "-tp"))
        ref = {"model": full_of(msd), "optim": full_of(osd["state"])}
        if rank == 0:
            torch.save(ref, path + "-tp.ref.pt")
    else:
        model, opt = tp_model()
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, storage_reader=tsnap.dcp.StorageReader(path + "-tp"))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        ref = torch.load(path + "-tp.ref.pt")
        msd, osd = get_state_dict(model, opt)
        for k, t in ref["model"].items():
            assert torch.equal(full_of(msd[k]), t), (rank, k)
        for k, st in ref["optim"].items():
            for kk, t in st.items():
                assert torch.equal(full_of(osd["state"][k][kk]), t), (rank, k, kk)

    if mode == "save":
        dcp.save(state(SAVE, False), storage_writer=tsnap.dcp.StorageWriter(path))
        live = state(SAVE, False)
        fut = dcp.async_save(live, storage_writer=tsnap.dcp.StorageWriter(path + "-async"))
        for t in live["model"].values():  # training goes on: the snapshot keeps the old values
            (t.to_local() if hasattr(t, "to_local") else t).add_(1)
        getattr(fut, "upload_completion", fut).result(timeout=120)
    else:
        for p in (path, path + "-async", path + "-one"):
            dest = state(LOAD, True)
            dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(p))
            want = state(LOAD, False)
            assert dest["step"] == 42, dest["step"]
            for k, t in want["model"].items():
                got = dest["model"][k]
                a = t.to_local() if hasattr(t, "to_local") else t
                b = got.to_local() if hasattr(got, "to_local") else got
                assert a.dtype == b.dtype and torch.equal(a, b), (rank, p, k)
    dist.barrier()
    dist.destroy_process_group()
    print("RANK_OK", rank)
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(tmp_path, world, path, mode, timeout=180):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), port, str(path),
                               mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env) for r in range(world)]
    outs = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"RANK_OK {r}" in out, f"rank {r}:\n{out[-4000:]}"
    return outs


def full_state():
    g = torch.Generator().manual_seed(0)
    return {"row": torch.randn(8, 6, generator=g), "col": torch.randn(5, 12, generator=g),
            "uneven": torch.randn(7, 3, generator=g), "rep": torch.randn(4, generator=g),
            "plain": torch.arange(10, dtype=torch.int64),
            "moment": torch.randn(9, 4, generator=g).to(torch.bfloat16),
            "grid": torch.randn(6, 10, generator=g), "tiny": torch.randn(1, 5, generator=g)}


@pytest.mark.dist
def test_two_ranks_save_and_async_save_dtensors_then_load_on_one_and_two(tmp_path):
    if not hasattr(tsnap, "DistGroup"):
        pytest.skip("this build of tsnap has no tsnap.DistGroup")
    path = tmp_path / "ckpt" / "s"
    run_ranks(tmp_path, 2, path, "save")
    assert tsnap.verify(path) == []
    manifest = json.loads((path / "MANIFEST.json").read_text())
    assert manifest["world_size"] == 2
    assert len(manifest["tensors"]["model.row"]["pieces"]) == 2
    # Each key once: the replicated tensor and the plain values are written by one rank.
    assert "pieces" not in manifest["tensors"]["model.rep"] or len(
        manifest["tensors"]["model.rep"]["pieces"]) == 1

    # One process, no process group: full tensors, from both saves.
    want = full_state()
    for p in (path, str(path) + "-async"):
        assert tsnap.verify(p) == []
        dest = {"model": {k: torch.zeros_like(v) for k, v in want.items()}, "step": 0}
        dcp.load(dest, storage_reader=tsnap.dcp.StorageReader(p))
        assert dest["step"] == 42
        for k, t in want.items():
            assert bits_equal(t, dest["model"][k]), (p, k)
        # And tsnap's own load assembles the pieces.
        flat = tsnap.load(p)
        for k, t in want.items():
            assert bits_equal(t, flat[f"model.{k}"]), (p, k)

    # The tensor-parallel model and its optimizer, into a plain model in one process.
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, storage_reader=tsnap.dcp.StorageReader(str(path) + "-tp"))
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    ref = torch.load(str(path) + "-tp.ref.pt")
    msd, osd = get_state_dict(model, opt)
    assert set(ref["model"]) == set(msd) and set(ref["optim"]) == set(osd["state"])
    for k, t in ref["model"].items():
        assert bits_equal(t, msd[k]), k
    for k, st in ref["optim"].items():
        for kk, t in st.items():
            assert bits_equal(t, osd["state"][k][kk]), (k, kk)

    # Two ranks again, every tensor sharded another way; and a snapshot saved by one process
    # (whole tensors) into the ranks' shards.
    dcp.save({"model": full_state(), "step": 42},
             storage_writer=tsnap.dcp.StorageWriter(str(path) + "-one"))
    run_ranks(tmp_path, 2, path, "load")


@pytest.mark.dist
def test_a_rank_that_fails_fails_the_save_on_every_rank(tmp_path):
    if not hasattr(tsnap, "DistGroup"):
        pytest.skip("this build of tsnap has no tsnap.DistGroup")
    path = tmp_path / "ckpt" / "s"
    start = time.monotonic()
    outs = run_ranks(tmp_path, 2, path, "fail", timeout=120)
    assert all(f"FAILED_OK {r}" in out for r, out in enumerate(outs)), outs
    assert "injected failure" in outs[1]
    assert "injected failure" in outs[0], outs[0]  # rank 0 learns rank 1's reason
    assert not path.exists() and tsnap.latest(path.parent) is None
    assert time.monotonic() - start < 45  # well within the group's 60 s timeout
