"""Multi-process tests (marker ``dist``): 2 and 4 ranks on this machine, Gloo on CPU, each rank a
process of dist_worker.py with the torchrun variables set; every launch is bounded in time."""

import glob
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

import tsnap

sys.path.insert(0, os.path.dirname(__file__))
import dist_worker  # noqa: E402

pytestmark = pytest.mark.dist

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, scenario, root, *args, timeout=90, expect_fail=()):
    """Runs ``world`` ranks of dist_worker.py; returns each rank's result dict (None for the
    ranks in ``expect_fail``, which must die). Kills every rank and fails after ``timeout``."""
    out = os.path.join(str(root), f"out-{scenario}-{time.monotonic_ns()}")
    os.makedirs(out)
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        procs.append(subprocess.Popen(
            [sys.executable, WORKER, scenario, str(root), out, *map(str, args)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    # Poll: a rank that fails (unexpectedly) leaves the others a few seconds to fail too (a
    # distributed save must not hang on a dead peer), then everything left is killed.
    deadline = time.monotonic() + timeout
    failed_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.poll() not in (None, 0) for r, p in enumerate(procs)
                                     if r not in expect_fail):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + 10):
            break
        time.sleep(0.05)
    hung = [r for r, p in enumerate(procs) if p.poll() is None]
    for p in procs:
        if p.poll() is None:
            p.kill()
    outputs = [p.communicate()[0] for p in procs]
    if hung:
        logs = "\n".join(f"--- rank {r} (rc {p.returncode}):\n{text[-3000:]}"
                         for r, (p, text) in enumerate(zip(procs, outputs)))
        pytest.fail(f"{scenario}: ranks {hung} did not finish (timeout {timeout} s):\n{logs}")
    results = []
    for rank, (p, text) in enumerate(zip(procs, outputs)):
        if rank in expect_fail:
            assert p.returncode != 0, f"rank {rank} should have died:\n{text}"
            results.append(None)
            continue
        assert p.returncode == 0, f"rank {rank} of {scenario} failed:\n{text}"
        with open(os.path.join(out, f"rank-{rank}.json")) as f:
            results.append(json.load(f))
    return results


def manifest(path):
    with open(os.path.join(path, "MANIFEST.json")) as f:
        return json.load(f)


def check_full(path):
    """One process loads the whole snapshot: every tensor is its global tensor, bitwise."""
    st = tsnap.load(path)
    flat = {**st["model"], **{"ddp." + k: v for k, v in st["ddp"].items()},
            "step": st["optim"]["state"]["s0"]["step"]}
    assert st["optim"]["param_groups"] == [{"lr": 0.5}]
    assert sorted(flat) == sorted(dist_worker.GLOBALS)
    for key, t in flat.items():
        want = dist_worker.global_tensor(key)
        assert t.dtype == want.dtype and t.shape == want.shape, key
        assert torch.equal(t.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), key


def check_layout(path, world):
    """Pieces of each sharded key are disjoint and written once; replicated keys are stored
    once, and their bytes are spread over the ranks' files."""
    m = manifest(path)
    assert m["world_size"] == world
    records = {name: t.get("pieces", [t]) for name, t in m["tensors"].items()}
    replicated = ["ddp/w", "ddp/b", "ddp/h", "optim/state/s0/step", "model/rep"]
    for key in replicated:
        assert len(records[key]) == 1 and "shard" not in records[key][0], key
    # Every distinct piece once: a (Replicate(), Shard(0)) tensor on a 2x2 mesh has 2 pieces.
    assert len(records["model/m2b"]) == 2
    assert len(records["model/tiny"]) == min(world, 3)  # the empty piece is not stored
    assert len(records["model/m2a"]) == world
    for key in ("model/s0", "model/s1"):
        assert len(records[key]) == world
    # Replicated bytes per rank: the greedy balance leaves at most the largest one's gap.
    per_rank = {r: 0 for r in range(world)}
    sizes = []
    for key in replicated:
        t = records[key][0]
        rank = m["files"][t["file"]]["rank"]
        nbytes = t["offsets"][1] - t["offsets"][0]
        per_rank[rank] += nbytes
        sizes.append(nbytes)
    assert sum(1 for v in per_rank.values() if v > 0) == min(world, len(replicated))
    assert max(per_rank.values()) - min(per_rank.values()) <= max(sizes)


def test_reshard_4_to_2_and_back(tmp_path):
    """DTensors (Shard(0), Shard(1), uneven with an empty piece, 2-D meshes, Replicate) and
    DDP-style plain tensors saved by 4 ranks, reloaded bitwise by 4 ranks in other placements,
    by 2 ranks, and by one process; then saved by 2 ranks and reloaded by one process."""
    s4 = str(tmp_path / "s4")
    r4 = run_ranks(4, "reshard", tmp_path, "-", "s4")
    for r in r4:
        assert r["reloaded"] == [] and r["reloaded_same"] == [], r
    check_full(s4)
    check_layout(s4, 4)
    assert tsnap.verify(s4) == []
    assert tsnap.metadata(s4) == {"world": 4}

    r2 = run_ranks(2, "reshard", tmp_path, s4, "s2")
    for r in r2:
        assert r["loaded_other_world"] == [] and r["reloaded"] == [], r
    check_full(str(tmp_path / "s2"))
    check_layout(str(tmp_path / "s2"), 2)

    # One process, plain tensors: load_into the global tensors (assembled from the pieces).
    dest = {k: torch.zeros_like(dist_worker.global_tensor(k)) for k in ("s0", "m2a", "m2b")}
    tsnap.load_into(s4, {"model": dest})
    for k, t in dest.items():
        assert torch.equal(t, dist_worker.global_tensor(k)), k


def test_periodic_across_ranks_and_resume_into_dtensors(tmp_path):
    r = run_ranks(2, "periodic", tmp_path)
    for res in r:
        assert res["snapshots"] == ["step-00000002", "step-00000004"], res
        assert res["resumed_step"] == 4 and res["resumed_ddp"] == [], res
        assert res["resumed_model"] == [], res
        assert res["resumed_step_tensor"] == int(dist_worker.global_tensor("step")) + 4
    assert tsnap.latest(str(tmp_path)).endswith("step-00000004")


@pytest.mark.parametrize("victim,how", [(1, "store"), (0, "env")])
def test_killed_rank_fails_the_others(tmp_path, victim, how):
    """A rank killed (SIGKILL) while its save is in flight: the other ranks' wait raises a
    tsnap.Error naming what went wrong, within the group's timeout; nothing is committed."""
    start = time.monotonic()
    results = run_ranks(2, "kill", tmp_path, victim, how, timeout=60, expect_fail=(victim,))
    elapsed = time.monotonic() - start
    survivor = results[1 - victim]
    assert survivor["error"] is not None, survivor
    assert survivor["error_type"] == "Error", survivor
    if victim == 1:
        assert "rank 1" in survivor["error"], survivor
    assert elapsed < 45
    names = [os.path.basename(p) for p in glob.glob(str(tmp_path / "*" / "MANIFEST.json"))]
    committed = sorted(os.path.basename(os.path.dirname(p))
                       for p in glob.glob(str(tmp_path / "*" / "MANIFEST.json")))
    assert committed == ["before"], (committed, names)
    assert tsnap.latest(str(tmp_path)).endswith("before")


def test_distgroup_errors():
    with pytest.raises(tsnap.InvalidArgument, match="not initialized"):
        tsnap.DistGroup()
    store = torch.distributed.HashStore()
    with pytest.raises(tsnap.InvalidArgument, match="rank"):
        tsnap.DistGroup(store, 2, 2, timeout=1)
    with pytest.raises(tsnap.InvalidArgument, match="Store"):
        tsnap.DistGroup(object(), 0, 1, timeout=1)
    g = tsnap.DistGroup(store, 0, 1, timeout=5)  # a one-rank group over an in-memory store
    assert (g.rank, g.world_size) == (0, 1)


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cpp_written_snapshots_load_in_python_across_world_sizes_and_back(tmp_path):
    exe = os.path.join(REPO, "build", "examples", "tsnap_example_train_ddp")
    cli = os.path.join(REPO, "build", "tsnap")
    if not (os.path.exists(exe) and os.path.exists(cli)):
        pytest.skip("needs the C++ build in build/ (scripts/build.sh)")
    # C++ -> Python: 2 ranks of the C++ data-parallel example write periodic snapshots (each
    # rank a half of the replicated model and optimizer state); Python reads the newest on one
    # process and, sharded otherwise, on 2 ranks.
    port = free_port()
    procs = [subprocess.Popen(
        [exe, "--run", str(tmp_path / "losses"), "--root", str(tmp_path / "cpp"), "--steps", "40",
         "--every", "20", "--preempt-at-step", "30"],  # no --preempt: not preempted
        env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    for p in procs:
        out = p.communicate(timeout=120)[0]
        assert p.returncode == 0, out[-3000:]
    newest = tsnap.latest(tmp_path / "cpp")
    assert newest.endswith("step-00000040")
    assert manifest(newest)["world_size"] == 2
    full = tsnap.load(newest, flat=True)
    assert len(full) > 10
    got = run_ranks(2, "from_cpp", tmp_path / "py", newest)
    for r in got:
        assert r["bad"] == [] and r["keys"] == len(full) and r["sharded"] > 0, r

    # Python -> C++: a snapshot of DTensor pieces written by 2 Python ranks is verified and
    # assembled by the C++ tool (consolidate), and the result holds the global tensors.
    root = tmp_path / "py2"
    run_ranks(2, "reshard", root, "-", "pieces")
    for cmd in (["verify", str(root / "pieces")],
                ["consolidate", str(root / "pieces"), str(root / "whole")],
                ["verify", str(root / "whole")]):
        run = subprocess.run([cli, *cmd], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
    assert manifest(root / "whole")["world_size"] == 1
    whole = tsnap.load(root / "whole", flat=True)
    for path, key in ((("model", k), k) for k in ("s0", "s1", "tiny", "rep", "m2a", "m2b")):
        want = dist_worker.global_tensor(key)
        assert torch.equal(whole["/".join(path)].view(torch.uint8), want.view(torch.uint8)), key
