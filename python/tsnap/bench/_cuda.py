"""``python -m tsnap.bench --cuda``: tsnap with the training state on a GPU, against what moving
the same bytes costs the hardware.

The state is GPT-2 small + Adam (both moments), fp32, 1.49 GB at ``--scale 1``, on the GPU
(Adam's ``step`` counters stay on the CPU, as torch.optim keeps them). ``--repeat`` saves of
each kind, medians:

  stall    save_async until the tensors may change, against the floor: a copy of the same
           bytes into pinned host memory allocated beforehand (``copy_(non_blocking=True)``
           per tensor, i.e. one cudaMemcpyAsync each, then ``torch.cuda.synchronize()``); the
           target is stall <= 1.1x the floor. bf16: converted on the GPU by tsnap, against
           ``.to(torch.bfloat16)`` on the GPU plus the same pinned copy of the half-size bytes
  durable  the same save until committed (on disk, fsynced), against the pinned copy plus a
           write of its bytes to one file and an fsync
  load     ``load_into`` the GPU tensors (they are checked bit for bit afterwards), against a
           read of the raw file into pinned memory plus host-to-device copies; the page cache
           of both is dropped first (``posix_fadvise(DONTNEED)``), so both read the disk
  loop     a training loop on the GPU (an MLP, Adam, ``--loop-mb`` MB of parameters and
           moments, batch ``--loop-batch``) with one snapshot per block of ``--block`` steps,
           paired blocks as ``--loop`` measures them (tsnap/bench/_loop.py): the step-time
           overhead of a snapshot every ``--block`` steps, eager and lazy

Every save is made in place of the last one; the working directory is removed at the end.
Without a GPU it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch

from .. import bench
from . import _dist, _loop

STALL_TARGET = 1.1


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_state(scale, device):
    """GPT-2 small (times ``scale``) + Adam state, fp32, on ``device``; steps on the CPU."""
    state = bench.state_of(_dist.shapes_for(scale))

    def move(v, key=""):
        if isinstance(v, dict):
            return {k: move(x, k) for k, x in v.items()}
        return v if key == "step" else v.to(device)

    return move(state)


class Pinned:
    """Host memory allocated once (pinned when the tensors are on a CUDA device) with one view
    per tensor, each 64-byte aligned; ``down`` copies the tensors into it (floating ones
    converted to ``dtype`` on their device first, if given), ``up`` back."""

    def __init__(self, tensors: list[torch.Tensor], dtype: torch.dtype | None = None) -> None:
        self.tensors = tensors
        self.dtypes = [dtype if dtype is not None and t.is_floating_point() else t.dtype
                       for t in tensors]
        sizes, total = [], 0
        for t, dt in zip(tensors, self.dtypes):
            n = t.numel() * torch.empty(0, dtype=dt).element_size()
            sizes.append((total, n))
            total = (total + n + 63) // 64 * 64
        pin = any(t.is_cuda for t in tensors)
        self.flat = torch.empty(max(total, 1), dtype=torch.uint8, pin_memory=pin)
        self.flat.fill_(0)  # fault it in now, not inside a timed copy
        self.nbytes = sum(n for _, n in sizes)
        self.views = [self.flat[o:o + n].view(dt).view(t.shape)
                      for (o, n), t, dt in zip(sizes, tensors, self.dtypes)]
        self.device = next((t.device for t in tensors if t.is_cuda), torch.device("cpu"))

    def down(self) -> float:
        """Device -> host: returns the seconds until every copy is done."""
        _sync(self.device)
        t0 = time.perf_counter()
        for v, t, dt in zip(self.views, self.tensors, self.dtypes):
            v.copy_(t if t.dtype == dt else t.to(dt), non_blocking=True)
        _sync(self.device)
        return time.perf_counter() - t0

    def up(self) -> None:
        """Host -> device, into the tensors."""
        for v, t in zip(self.views, self.tensors):
            t.copy_(v, non_blocking=True)


def _bytes_of(buffer):
    """A writable memoryview of the contiguous CPU uint8 tensor ``buffer`` (no numpy needed)."""
    return memoryview((ctypes.c_ubyte * buffer.numel()).from_address(buffer.data_ptr())).cast("B")


def write_file(path, buffer):
    """Writes the bytes of the uint8 tensor ``buffer`` to ``path`` and fsyncs it."""
    view = _bytes_of(buffer)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        step = 256 << 20
        for off in range(0, len(view), step):
            chunk = view[off:off + step]
            while len(chunk):
                chunk = chunk[os.write(fd, chunk):]
        os.fsync(fd)
    finally:
        os.close(fd)
    bench.fsync_dir(os.path.dirname(path) or ".")


def read_file(path, buffer):
    """Reads ``path`` into the uint8 tensor ``buffer``."""
    view = _bytes_of(buffer)
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise OSError(f"{path}: short read at {got}")
            got += n


def _median(values):
    return statistics.median(values) if values else float("nan")


def measure_saves(state, tensors, workdir, repeat, device):
    """Stall and durable time of tsnap's saves (fp32 and bf16) and of their floors."""
    import tsnap
    floor32, floor16 = Pinned(tensors), Pinned(tensors, torch.bfloat16)
    raw = os.path.join(workdir, "raw.bin")
    out: dict[str, Any] = {"bytes": floor32.nbytes, "bytes_bf16": floor16.nbytes}
    snap = tsnap.Snapshotter(os.path.join(workdir, "snap"))
    snap.prepare(state)
    snap.save_async("warm-up", state, overwrite=True).wait()
    engine = None
    rows: dict[str, list[float]] = {k: [] for k in (
        "stall", "durable", "stall_bf16", "durable_bf16", "floor", "floor_bf16", "raw_durable")}
    for _ in range(repeat):
        rows["floor"].append(floor32.down())
        rows["floor_bf16"].append(floor16.down())
        t0 = time.perf_counter()
        floor32.down()
        write_file(raw, floor32.flat)
        rows["raw_durable"].append(time.perf_counter() - t0)
        for dtype, suffix in ((None, ""), (torch.bfloat16, "_bf16")):
            _sync(device)
            t0 = time.perf_counter()
            h = snap.save_async("s" + suffix, state, dtype=dtype, overwrite=True)
            stall = time.perf_counter() - t0
            h.wait()
            rows["stall" + suffix].append(stall)
            rows["durable" + suffix].append(time.perf_counter() - t0)
            engine = h.stats.engine + ("+O_DIRECT" if h.stats.direct else "")
    snap.close()
    out.update({k: _median(v) for k, v in rows.items()})
    out["engine"] = engine
    out["snapshot"] = os.path.join(workdir, "snap", "s")
    out["raw"] = raw
    out["floor32"] = floor32
    return out


def measure_loads(state, tensors, saved, repeat, device):
    """load_into the device tensors against a raw read + host-to-device copies, both cold."""
    import tsnap
    reference = [t.clone() for t in tensors]
    floor32 = saved.pop("floor32")
    loads, raws, engine = [], [], None
    for _ in range(repeat):
        for t in tensors:
            t.zero_()
        bench.drop_page_cache(saved["snapshot"])
        _sync(device)
        t0 = time.perf_counter()
        report = tsnap.load_into(saved["snapshot"], state)
        loads.append(time.perf_counter() - t0)
        engine = report["engine"]
        bad = [i for i, (t, r) in enumerate(zip(tensors, reference)) if not torch.equal(t, r)]
        if bad:
            raise AssertionError(f"load_into into {device}: {len(bad)} tensors differ from the "
                                 "saved state")
        bench.drop_page_cache(saved["raw"])
        _sync(device)
        t0 = time.perf_counter()
        read_file(saved["raw"], floor32.flat)
        floor32.up()
        _sync(device)
        raws.append(time.perf_counter() - t0)
    return {"load": _median(loads), "raw_load": _median(raws), "load_engine": engine}


def run(scale: float = 1.0, repeat: int = 5, workdir: str | None = None,
        device: str | torch.device = "cuda", loop_mb: int = 1500, loop_batch: int = 1024,
        pairs: int = 10, block: int = 50, loop: bool = True) -> dict[str, Any]:
    """Every measurement above; returns a dict of figures (seconds, bytes, loop results)."""
    device = torch.device(device)
    top = tempfile.mkdtemp(prefix="tsnap-bench-cuda-", dir=workdir or ".")
    try:
        state = gpu_state(scale, device)
        tensors = [t for t in bench.tensors_of(state) if t.device.type == device.type]
        saved = measure_saves(state, tensors, top, repeat, device)
        shutil.rmtree(os.path.join(top, "snap", "s_bf16"), ignore_errors=True)
        loaded = measure_loads(state, tensors, saved, repeat, device)
        result = {"device": str(device), "scale": scale, "repeat": repeat, "torch":
                  torch.__version__, "name": _device_name(device), **saved, **loaded}
        del state, tensors
        shutil.rmtree(top, ignore_errors=True)
        os.makedirs(top, exist_ok=True)
        result["loop"] = []
        if loop:
            for staging in ("eager", "lazy"):
                r = _loop.run(loop_mb, pairs, block, staging, os.path.join(top, staging),
                                    device=device, batch=loop_batch)
                result["loop"].append(r)
        return result
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def table(r: dict[str, Any]) -> str:
    gb, gb16 = r["bytes"] / 1e9, r["bytes_bf16"] / 1e9

    def row(what, tsnap_s, floor_s, floor_what, gbytes, target=None):
        ratio = tsnap_s / floor_s if floor_s > 0 else float("inf")
        verdict = "" if target is None else (" met" if ratio <= target else " MISSED")
        return (f"| {what} | {tsnap_s:.4f} | {gbytes / tsnap_s:.2f} | {floor_what} | "
                f"{floor_s:.4f} | {ratio:.2f}{verdict} |")

    lines = [
        f"state: {gb:.2f} GB fp32 on {r['name']} (GPT-2 small x {r['scale']} + Adam), "
        f"{r['repeat']} runs each, medians; torch {r['torch']}; tsnap engine {r['engine']}, "
        f"load {r['load_engine']}",
        "| tsnap | s | GB/s | floor | s | tsnap / floor |",
        "|---|---:|---:|---|---:|---:|",
        row(f"stall, fp32 (target <= {STALL_TARGET}x)", r["stall"], r["floor"],
            "pinned D2H copy", gb, STALL_TARGET),
        row("stall, bf16 converted on the GPU (GB/s of fp32)", r["stall_bf16"], r["floor_bf16"],
            ".to(bf16) + pinned D2H copy", gb),
        row("durable, fp32", r["durable"], r["raw_durable"], "pinned D2H + write + fsync", gb),
        row("durable, bf16 (GB/s of bf16 written)", r["durable_bf16"], r["raw_durable"],
            "pinned D2H + write + fsync of fp32", gb16),
        row("load_into GPU tensors, cold", r["load"], r["raw_load"],
            "read into pinned + H2D, cold", gb),
    ]
    for loop in r["loop"]:
        lines.append(_loop.report(loop))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> dict[str, Any] | None:
    """Runs the benchmark and prints its table; returns the figures, or None without a GPU."""
    if not torch.cuda.is_available():
        print(f"tsnap.bench --cuda: no CUDA device is available here (torch {torch.__version__}, "
              f"built for CUDA {torch.version.cuda or 'none'}): nothing to measure", flush=True)
        return None
    r = run(scale=args.scale, repeat=args.repeat or 5, workdir=args.dir, device="cuda",
            loop_mb=args.loop_mb, loop_batch=args.loop_batch, pairs=args.pairs,
            block=args.block or 50, loop=not args.no_loop)
    print(table(r), flush=True)
    return r
