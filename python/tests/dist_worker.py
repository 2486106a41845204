"""One rank of the multi-process tests (test_dist.py starts N of these with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set, as torchrun does).

    python dist_worker.py SCENARIO ROOT OUT [ARGS...]

Each rank writes what it found to OUT/rank-<r>.json and exits 0, or raises (exit 1). The
state it saves is made of global tensors that every process (the test too) derives from their
key, cut into DTensors by ``distribute_tensor(..., src_data_rank=None)``: no collective.
"""

import json
import os
import signal
import sys
import zlib

import torch

# key -> (global shape, dtype). "2d" tensors live on a 2-D mesh.
GLOBALS = {
    "s0": ((37, 16), torch.float32),     # Shard(0), uneven over 2 and 4 ranks
    "s1": ((8, 10), torch.float64),      # Shard(1), uneven over 4
    "tiny": ((3,), torch.int64),         # Shard(0) over 4: one rank's piece is empty
    "rep": ((5, 7), torch.float32),      # Replicate()
    "m2a": ((9, 11), torch.float32),     # (Shard(0), Shard(1)) on the 2-D mesh
    "m2b": ((13, 5), torch.bfloat16),    # (Replicate(), Shard(0)) on the 2-D mesh
    "ddp.w": ((1000,), torch.float32),   # plain tensors, equal on every rank (DDP)
    "ddp.b": ((300, 20), torch.float32),
    "ddp.h": ((4096,), torch.bfloat16),
    "step": ((), torch.int64),
}
TWO_D = ("m2a", "m2b")


def global_tensor(key):
    shape, dtype = GLOBALS[key]
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)


def placements(variant):
    """key -> placements; "save" is the layout saved, "other" the one loaded back."""
    from torch.distributed.tensor import Replicate, Shard
    if variant == "save":
        return {"s0": [Shard(0)], "s1": [Shard(1)], "tiny": [Shard(0)], "rep": [Replicate()],
                "m2a": [Shard(0), Shard(1)], "m2b": [Replicate(), Shard(0)],
                "ddp.w": None, "ddp.b": None, "ddp.h": None, "step": None}
    return {"s0": [Shard(1)], "s1": [Shard(0)], "tiny": [Replicate()], "rep": [Shard(0)],
            "m2a": [Shard(1), Shard(0)], "m2b": [Shard(0), Replicate()],
            "ddp.w": [Shard(0)], "ddp.b": [Shard(1)], "ddp.h": None, "step": None}


def finish_group():
    """Ends the default group once every rank is done with it: rank 0 hosts the store, and a
    rank still setting up a group through it (a device mesh's subgroups) when rank 0 exits
    gets "connection reset by peer"."""
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()


def meshes(world):
    from torch.distributed.device_mesh import init_device_mesh
    one = init_device_mesh("cpu", (world,))
    two = init_device_mesh("cpu", (2, world // 2) if world >= 4 else (1, world),
                           mesh_dim_names=("dp", "tp"))
    return one, two


def state(world, variant, zeros=False):
    """The nested state this rank holds: a model and an optimizer-like part."""
    from torch.distributed.tensor import distribute_tensor
    one, two = meshes(world)
    flat = {}
    for key, places in placements(variant).items():
        t = global_tensor(key)
        if zeros:
            t = torch.zeros_like(t)
        if places is not None:
            mesh = two if key in TWO_D else one
            t = distribute_tensor(t, mesh, places, src_data_rank=None)
        flat[key] = t
    return {"model": {k: flat[k] for k in ("s0", "s1", "tiny", "rep", "m2a", "m2b")},
            "ddp": {"w": flat["ddp.w"], "b": flat["ddp.b"], "h": flat["ddp.h"]},
            "optim": {"state": {"s0": {"step": flat["step"]}}, "param_groups": [{"lr": 0.5}]}}


def key_of(path):
    return {"model": lambda k: k, "ddp": lambda k: "ddp." + k}[path[0]](path[1])


def check_state(st, world, variant):
    """Every tensor of ``st`` (loaded into) equals what the layout gives of the globals."""
    from torch.distributed.tensor import DTensor
    expected = state(world, variant)
    bad = []
    pairs = [(("model", k), st["model"][k], expected["model"][k]) for k in st["model"]]
    pairs += [(("ddp", k), st["ddp"][k], expected["ddp"][k]) for k in st["ddp"]]
    pairs.append((("optim", "step"), st["optim"]["state"]["s0"]["step"],
                  expected["optim"]["state"]["s0"]["step"]))
    for path, got, want in pairs:
        if isinstance(got, DTensor):
            got, want = got.to_local(), want.to_local()
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(
                got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
            bad.append("/".join(path))
    return bad


def main():
    scenario, root, out = sys.argv[1:4]
    args = sys.argv[4:]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    import torch.distributed as dist

    import tsnap
    result = {"rank": rank}

    if scenario == "reshard":
        # Load the snapshot ARGS[0] (if any) saved by another world size into the "other"
        # layout, check it, then save this world's state as ARGS[1] and load it back.
        dist.init_process_group("gloo")
        group = tsnap.DistGroup(timeout=30)  # the default group's store
        if args[0] != "-":
            st = state(world, "other", zeros=True)
            tsnap.load_into(args[0], st)
            result["loaded_other_world"] = check_state(st, world, "other")
        with tsnap.Snapshotter(root, group=group, chunk_bytes=64 << 10) as snap:
            h = snap.save_async(args[1], state(world, "save"), metadata={"world": world})
            h.wait()
            result["path"] = h.path
        path = os.path.join(root, args[1])
        st = state(world, "other", zeros=True)
        report = tsnap.load_into(path, st, strict=True)
        result["bytes_read"] = report["bytes_read"]
        result["reloaded"] = check_state(st, world, "other")
        st = state(world, "save", zeros=True)
        tsnap.load_into(path, st)
        result["reloaded_same"] = check_state(st, world, "save")
        finish_group()

    elif scenario == "periodic":
        # A periodic hook across ranks over the default group's store, then a resume into
        # DTensors on a fresh state.
        dist.init_process_group("gloo")
        group = tsnap.DistGroup.from_env(timeout=30)  # initialized: the default group's
        st = state(world, "save")
        hook = tsnap.PeriodicSnapshots(root, lambda: st, group=group, every_steps=2,
                                       keep_last=2, log=False)
        for step in range(1, 6):
            for t in st["ddp"].values():
                t.add_(1)
            st["optim"]["state"]["s0"]["step"].add_(1)
            hook.after_step(step)
        stats = hook.finish()
        hook.close()
        result["snapshots"] = [r["name"] for r in stats.snapshots]
        fresh = state(world, "other", zeros=True)
        hook = tsnap.PeriodicSnapshots(root, lambda: fresh, group=group, every_steps=2,
                                       log=False)
        got = {}
        step = hook.resume(lambda s: got.update(state=s), into=fresh)
        hook.close()
        result["resumed_step"] = step
        want = state(world, "other")
        for t in want["ddp"].values():
            for _ in range(4):  # as the training did (x + 4 rounds otherwise)
                t.to_local().add_(1) if hasattr(t, "to_local") else t.add_(1)
        result["resumed_ddp"] = [
            k for k in want["ddp"]
            if not torch.equal(*(x.to_local() if hasattr(x, "to_local") else x
                                 for x in (fresh["ddp"][k], want["ddp"][k])))]
        result["resumed_step_tensor"] = int(fresh["optim"]["state"]["s0"]["step"])
        result["resumed_model"] = [k for k in check_state(fresh, world, "other")
                                   if k.startswith("model")]
        finish_group()

    elif scenario == "kill":
        # ARGS[0]: the rank that dies (SIGKILL) right after its save_async returned.
        victim = int(args[0])
        if args[1] == "store":
            host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
            store = dist.TCPStore(host, port, world, rank == 0, wait_for_workers=False)
            group = tsnap.DistGroup(store, rank, world, timeout=3)
        else:
            group = tsnap.DistGroup.from_env(timeout=3)  # no process group: env rendezvous
        snap = tsnap.Snapshotter(root, group=group)
        # A first save that commits, so that the failed one must leave it alone.
        snap.save_async("before", {"w": torch.arange(1000.0)}).wait()
        h = snap.save_async("doomed", {"w": torch.arange(100000.0), "r": torch.ones(5)})
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            h.wait(timeout=60)
            result["error"] = None
        except tsnap.Error as e:
            result["error"] = str(e)
            result["error_type"] = type(e).__name__
        try:
            snap.close()
        except tsnap.Error:
            pass
    elif scenario == "from_cpp":
        # ARGS[0]: a snapshot the C++ engine wrote on other ranks; every tensor with a first
        # dimension of at least this world's size is loaded as a Shard(0) DTensor, the rest
        # whole, and compared with the same layout cut from a one-process load.
        dist.init_process_group("gloo")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard, distribute_tensor
        mesh = init_device_mesh("cpu", (world,))
        full = tsnap.load(args[0], flat=True)

        def laid_out(t):
            if t.dim() >= 1 and t.shape[0] >= world:
                return distribute_tensor(t, mesh, [Shard(0)], src_data_rank=None)
            return t.clone()

        dest = {k: laid_out(torch.zeros_like(v)) for k, v in full.items()}
        tsnap.load_into(args[0], dest)
        bad = []
        for k, got in dest.items():
            want = laid_out(full[k])
            if isinstance(got, DTensor):
                got, want = got.to_local(), want.to_local()
            if not torch.equal(got.reshape(-1).view(torch.uint8),
                               want.reshape(-1).view(torch.uint8)):
                bad.append(k)
        result["keys"] = len(dest)
        result["sharded"] = sum(isinstance(v, DTensor) for v in dest.values())
        result["bad"] = bad
        finish_group()

    else:
        raise SystemExit(f"unknown scenario {scenario}")

    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # no teardown that could wait on a dead peer


if __name__ == "__main__":
    main()
