"""``python -m tsnap.bench --loop``: what periodic snapshots cost a training loop, measured so
that a noisy machine can still decide it.

A small MLP trains on the CPU (Adam; the parameters and moments are about ``--size-mb`` MB);
``python -m tsnap.bench --cuda`` runs the same on the GPU (tsnap/bench/_cuda.py), where each
block's time is taken after a ``torch.cuda.synchronize()``.
The run alternates blocks of ``--block`` steps with and without one snapshot (the order of the
two within each of ``--pairs`` pairs is random): a block with a snapshot starts a
``save_async`` (eager: the call stalls for the staging copy; lazy: ``wait_staged`` right before
the next ``optimizer.step()``) and waits for its commit at the block's end. Slow drift of the
machine hits both blocks of a pair alike, so the figure is the **paired difference** of block
times, with/without: its median, and a bootstrap 95 % interval of that median (2,000
resamples of the pairs). The same for the process's CPU time (every thread), and for the CPU
time of tsnap's own threads (named ``tsnap-*``, and the kernel's io_uring workers of their rings;
read from ``/proc/self/task``, Linux), taken from the block's start to the snapshot's commit:
what one snapshot costs a busy host beyond the stall, which the caller's thread spends. The
process's figure moves with the training's own threads (LibTorch's intra-op threads spin while
they wait); tsnap's threads' figure does not. The eager target is ``stall / block time + 1 %``;
the lazy one 1 %. A third run, ``copy``, takes no snapshot: a thread copies the state into
buffers made beforehand (``Tensor.copy_``, which may use LibTorch's intra-op threads) and the
next ``optimizer.step()`` waits for it, so its overhead is the floor of any snapshot that
copies the state in the background, before a byte is written.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from typing import Any

import torch


def bootstrap_median(values, resamples=2000, seed=0):
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def tsnap_threads():
    """CPU nanoseconds run so far by each live thread of this process that works for tsnap:
    those named ``tsnap-*`` and the kernel's io_uring workers of their rings (``iou-wrk-<tid>``
    of such a thread), from ``/proc/self/task/*/schedstat``; None where there is none."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    names, ns = {}, {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[tid] = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            names.pop(tid, None)  # a thread that ended meanwhile, or no schedstat
    if not ns:
        return None
    own = {t for t, n in names.items() if n.startswith("tsnap-")}
    own |= {t for t, n in names.items() if n.startswith("iou-wrk-") and n[8:] in own}
    return {t: ns[t] for t in own if t in ns}


def cpu_between(before, after):
    """CPU seconds tsnap's threads ran between two tsnap_threads() samples: the growth of those
    in both, and all of those new in the second. A thread gone by the second (an io_uring worker
    ends after a few idle seconds) ran nothing that can be seen since the first."""
    if before is None or after is None:
        return None
    return sum(v - before.get(t, 0) for t, v in after.items()) / 1e9


def run(size_mb: float, pairs: int, block: int, staging: str, workdir: str, seed: int = 0,
        device: str | torch.device = "cpu", batch: int = 64) -> dict[str, Any]:
    """One run of ``pairs`` block pairs with ``staging`` ('eager', 'lazy' or 'copy'); returns
    its figures (as ``report`` prints them)."""
    import tsnap
    torch.manual_seed(seed)
    device = torch.device(device)
    # The GPU's work is asynchronous: a block ends when the device has done it.
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # Parameters + two Adam moments = size_mb: each layer is d x d fp32.
    d = 1024
    layers = max(1, int(size_mb * 1e6 / 3 / (4 * d * d)))
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(layers)]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(batch, d, device=device)

    def step(before_update=None):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        if before_update is not None:
            before_update()
        opt.step()

    for _ in range(3):  # the optimizer's moments exist from here on
        step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    snap: Any
    if staging == "copy":
        snap = _BackgroundCopy(state)
    else:
        snap = tsnap.Snapshotter(workdir)
        snap.prepare(state)
        snap.save_async("warm-up", state, staging=staging).wait()
    sync()
    rng = random.Random(seed)
    wall: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    own: dict[bool, list[float]] = {False: [], True: []}  # tsnap's threads
    stalls = []
    n = 0
    for _ in range(pairs):
        order = [False, True]
        rng.shuffle(order)
        for with_snapshot in order:
            t0, c0, o0 = time.perf_counter(), time.process_time(), tsnap_threads()
            o1 = None
            handle = None
            if with_snapshot:
                s0 = time.perf_counter()
                handle = snap.save_async(f"s{n}", state, staging=staging, overwrite=True)
                stalls.append(time.perf_counter() - s0)
                n += 1
            for k in range(block):
                staged = handle.wait_staged if handle is not None and k == 0 else None
                step(staged)
                if handle is not None and o1 is None and handle.done():
                    o1 = tsnap_threads()  # before its io_uring workers go idle and end
            if handle is not None:
                handle.wait()
            sync()
            wall[with_snapshot].append(time.perf_counter() - t0)
            cpu[with_snapshot].append(time.process_time() - c0)
            own_s = cpu_between(o0, o1 if o1 is not None else tsnap_threads())
            if own_s is not None:
                own[with_snapshot].append(own_s)
            if handle is not None and handle.path is not None:
                shutil.rmtree(handle.path, ignore_errors=True)
    snap.close()
    diff = [b - a for a, b in zip(wall[False], wall[True])]
    cpu_diff = [b - a for a, b in zip(cpu[False], cpu[True])]
    base = statistics.median(wall[False])
    med, (lo, hi) = statistics.median(diff), bootstrap_median(diff)
    cmed, (clo, chi) = statistics.median(cpu_diff), bootstrap_median(cpu_diff)
    own_diff = [b - a for a, b in zip(own[False], own[True])]
    if len(own_diff) == pairs:
        omed, (olo, ohi) = statistics.median(own_diff), bootstrap_median(own_diff)
    else:
        omed, olo, ohi = None, None, None
    stall = statistics.median(stalls)
    target = {"eager": stall / base + 0.01, "lazy": 0.01}.get(staging)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(v.numel() * v.element_size() for s in opt.state_dict()["state"].values()
                  for v in s.values() if torch.is_tensor(v))
    return {
        "device": str(device), "staging": staging, "state_mb": nbytes / 1e6, "pairs": pairs,
        "block_steps": block,
        "block_s": base, "stall_s": stall,
        "overhead": med / base, "overhead_ci": (lo / base, hi / base), "target": target,
        "cpu_s_per_snapshot": cmed, "cpu_ci": (clo, chi),
        "tsnap_cpu_s_per_snapshot": omed, "tsnap_cpu_ci": (olo, ohi),
    }


class _BackgroundCopy:
    """The floor of the ``copy`` rows: no snapshot, only what any snapshot that copies the
    state in the background must do, one thread copying every tensor into buffers allocated
    (and faulted in) beforehand; the next ``optimizer.step()`` waits for it, as a lazy save's
    ``wait_staged``. Its overhead is what copying the bytes costs the loop, before any write."""

    class _Handle:
        path = None

        def __init__(self, thread):
            self._thread = thread

        def wait_staged(self):
            self._thread.join()

        wait = wait_staged

        def done(self):
            return not self._thread.is_alive()

    def __init__(self, state):
        from tsnap._tree import flatten
        tensors, _ = flatten(state)
        self._pairs = [(t, torch.empty_like(t).fill_(0)) for t in tensors.values()]

    def save_async(self, name, state, staging=None, overwrite=False):
        def copy():
            with torch.no_grad():
                for src, dst in self._pairs:
                    dst.copy_(src)
        thread = threading.Thread(target=copy)
        thread.start()
        return self._Handle(thread)

    def close(self):
        self._pairs = []


def report(r: dict[str, Any]) -> str:
    lo, hi = r["overhead_ci"]
    clo, chi = r["cpu_ci"]
    if r["target"] is None:
        verdict = "the floor of a snapshot that copies the state in the background"
    else:
        verdict = ("target <= " + f"{r['target'] * 100:.2f} %: " +
                   ("met" if hi <= r["target"] else "missed" if lo > r["target"]
                    else "undecided (the interval straddles the target)"))
    return "\n".join([
        f"{r['staging']} ({r['device']}): {r['pairs']} pairs of {r['block_steps']}-step blocks "
        f"({r['block_s']:.3f} s without a snapshot), state {r['state_mb']:.0f} MB, "
        f"stall {r['stall_s'] * 1e3:.1f} ms",
        f"  step-time overhead of one snapshot per block: {r['overhead'] * 100:+.2f} % "
        f"(95 % CI {lo * 100:+.2f} .. {hi * 100:+.2f} %), {verdict}",
        f"  CPU per snapshot (all threads): {r['cpu_s_per_snapshot']:.3f} s "
        f"(95 % CI {clo:.3f} .. {chi:.3f})",
    ] + ([] if r.get("tsnap_cpu_s_per_snapshot") is None else [
        f"  CPU per snapshot of tsnap's threads: {r['tsnap_cpu_s_per_snapshot']:.3f} s "
        f"(95 % CI {r['tsnap_cpu_ci'][0]:.3f} .. {r['tsnap_cpu_ci'][1]:.3f})"]))


def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    workdir = args.dir or tempfile.mkdtemp(prefix="tsnap-loop-")
    os.makedirs(workdir, exist_ok=True)
    results = []
    for staging in getattr(args, "stagings", ("eager", "lazy", "copy")):
        r = run(args.size_mb, args.pairs, args.block, staging, os.path.join(workdir, staging))
        print(report(r), flush=True)
        results.append(r)
    return results
