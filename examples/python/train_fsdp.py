"""FSDP2 training on CPU ranks (Gloo) with tsnap's periodic snapshots, preemption and resume.

As a training script, under torchrun::

    torchrun --nproc-per-node 2 examples/python/train_fsdp.py --root runs/fsdp --steps 60

Each rank trains a small MLP sharded with ``fully_shard`` (FSDP2: parameters and AdamW state are
DTensors, Shard(0)); every ``--every`` steps tsnap writes one snapshot from both ranks (each its
shards, rank 0 commits), with no collective on the training's process group. SIGTERM to any rank
makes every rank take a final snapshot at the same step and stop; a new launch resumes from the
newest snapshot, on any number of ranks (each reads only its shards' bytes).

As a demo (``python examples/python/train_fsdp.py --demo``), it runs four trainings and compares
their loss curves bit for bit:
  1. 2 ranks, no snapshots (the reference);
  2. 2 ranks with snapshots; rank 1 alone gets SIGTERM after step P: both ranks stop after the
     same final snapshot;
  3. 2 ranks resumed from it, to the last step;
  4. 1 process resumed from the same snapshot (a copy), to the last step, doing both ranks'
     work: their two batches per step, gradients summed and halved as FSDP2's reduce-scatter
     does. With 2 ranks that gives the same floats: a sum of two numbers does not depend on
     the order, and halving is exact. (With more ranks the reduction order is the
     collective's, which one process would have to replicate; dropout is off so that no
     per-rank random state needs saving: each rank's batches come from a generator seeded by
     (step, rank).)
It exits with 0 only when runs 2+3 and 2+4 match run 1 bit for bit.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import tsnap

SEED = 1234
DIM, HIDDEN, CLASSES, BATCH = 32, 64, 10, 16


def make_model():
    torch.manual_seed(SEED)  # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(),
                               torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(),
                               torch.nn.Linear(HIDDEN, CLASSES))


def batch(step, rank):
    """Rank ``rank``'s batch at ``step``: no random state to save, one process can draw all."""
    g = torch.Generator().manual_seed(SEED + 1000003 * step + rank)
    x = torch.randn(BATCH, DIM, generator=g)
    return x, torch.randint(0, CLASSES, (BATCH,), generator=g)


def train(args):
    """One training run: a rank of a torchrun launch, or (--single) one process doing the work
    of two ranks."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ranks_here = [0, 1] if args.single else [rank]  # whose batches this process trains on

    def app_state():
        model_sd, optim_sd = get_state_dict(model, opt)
        return {"model": model_sd, "optim": optim_sd}

    hook, step = None, 0
    if args.root:
        group = tsnap.DistGroup(timeout=60)  # the default group's store: no second rendezvous
        hook = tsnap.PeriodicSnapshots(args.root, app_state, group=group, every_steps=args.every,
                                       on_signals=[signal.SIGTERM], keep_last=3)

        def apply(state):
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])

        step = hook.resume(apply, into=app_state)  # each rank reads its own shards
    losses = {}
    while step < args.steps:
        opt.zero_grad()
        for r in ranks_here:
            x, y = batch(step, r)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            # FSDP2 averages gradients over the ranks; one process doing two ranks' work sums
            # their gradients and halves them the same way.
            (loss / len(ranks_here)).backward() if len(ranks_here) > 1 else loss.backward()
            losses[f"{step}/{r}"] = loss.item().hex()
        opt.step()
        time.sleep(args.step_time)  # stands for a real model's compute (see --step-time)
        step += 1
        if hook is not None:
            hook.after_step(step)
            if hook.stop_requested:
                break
        if args.preempt_at and step == args.preempt_at and rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice to one rank only
    if hook is not None:
        hook.finish()
        hook.close()
    if args.out:
        with open(f"{args.out}.{rank}", "w") as f:
            json.dump({"losses": losses, "last_step": step}, f)
    dist.destroy_process_group()


def launch(script_args, nproc, tmp, env=None):
    """Runs this script under torchrun with ``nproc`` ranks; returns the ranks' outputs."""
    out = os.path.join(tmp, f"run-{len(os.listdir(tmp))}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={port}", os.path.abspath(__file__),
           "--out", out, *script_args]
    subprocess.run(cmd, check=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    merged = {}
    for r in range(nproc):
        with open(f"{out}.{r}") as f:
            merged.update(json.load(f)["losses"])
    return merged


def demo(args):
    tmp = tempfile.mkdtemp(prefix="tsnap-fsdp-")
    try:
        steps = ["--steps", str(args.steps), "--every", str(args.every), "--step-time",
                 str(args.step_time)]
        root = os.path.join(tmp, "snapshots")
        print(f"demo: 1. reference, 2 ranks, {args.steps} steps", flush=True)
        ref = launch(steps, 2, tmp)
        print(f"demo: 2. 2 ranks with snapshots every {args.every} steps, SIGTERM to rank 1 "
              f"after step {args.preempt_at}", flush=True)
        first = launch(steps + ["--root", root, "--preempt-at", str(args.preempt_at)], 2, tmp)
        copy = os.path.join(tmp, "snapshots-copy")
        shutil.copytree(root, copy)
        print("demo: 3. 2 ranks, resumed", flush=True)
        second = launch(steps + ["--root", root], 2, tmp)
        print("demo: 4. 1 process, resumed from the same snapshot", flush=True)
        single = launch(steps + ["--root", copy, "--single"], 1, tmp)
        ok = True
        for name, tail in (("2+3", second), ("2+4", single)):
            got = {**first, **tail}
            same = got == ref
            ok = ok and same
            stop = max(int(k.split("/")[0]) for k in first) + 1
            print(f"demo: runs {name}: {len(got)} losses (stopped at step {stop}, resumed "
                  f"{len(tail)}), {'bitwise equal to' if same else 'DIFFERENT from'} run 1")
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--demo", action="store_true", help="run the four trainings and compare")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--preempt-at", type=int, default=37)
    p.add_argument("--step-time", type=float, default=0.02,
                   help="seconds each step sleeps, standing for a real model's compute: a "
                        "signal's final snapshot is taken about 0.5 s of training after the "
                        "signal, at a step every rank agrees on, so the toy model's "
                        "sub-millisecond steps would otherwise end the run first")
    p.add_argument("--root", default="", help="snapshot root (none: no snapshots)")
    p.add_argument("--single", action="store_true", help="one process doing two ranks' work")
    p.add_argument("--out", default="", help="write this rank's losses to OUT.<rank>")
    args = p.parse_args()
    if args.demo:
        sys.exit(demo(args))
    if args.preempt_at and "--preempt-at" not in sys.argv:
        args.preempt_at = 0  # only the demo's second run is preempted
    train(args)


if __name__ == "__main__":
    main()
