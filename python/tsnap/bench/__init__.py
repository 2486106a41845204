"""``python -m tsnap.bench``: the same state saved by torch.save, DCP and tsnap, side by side.

The state is GPT-2 shaped (embeddings, attention and MLP weights, layer norms) with Adam's two
moments per parameter, fp32, about ``--size-mb`` MB in all. Each method runs in its own
process (so its memory is its own) and saves the state ``--repeat`` times:

  stall    how long the training thread is blocked before it may change the tensors again
           (the call; for DCP with async staging, the call plus its staging future)
  durable  from the call until the checkpoint is on disk (fsynced) and committed
  GB/s     the state's bytes / durable
  RSS      resident memory after the last save minus after the first (growth), and the peak
           during the saves above the process with its state (VmHWM)
  load     reading it back into the existing tensors, with the files' page cache dropped first
           (posix_fadvise DONTNEED), so every method reads from the disk

Medians over the repeats (the first save included); ``--json`` writes every figure.
``--loop`` measures a training loop's step-time overhead (tsnap/bench/_loop.py), ``--cuda`` the
state on a GPU against pinned copies of the same bytes (tsnap/bench/_cuda.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

# Parameter name -> shape.
Shapes = dict[str, tuple[int, ...]]

METHODS = {
    "torch.save": "torch.save + fsync",
    "dcp.save": "DCP save",
    "dcp.async": "DCP async_save (default stager)",
    "dcp.async.cached": "DCP async_save (FileSystemWriter cache_staged_state_dict)",
    "dcp.async.stager": "DCP async_save (DefaultStager, async staging)",
    "tsnap": "tsnap save_async fp32",
    "tsnap.bf16": "tsnap save_async bf16",
}


def gpt2_shapes(vocab: int, d: int, layers: int, positions: int = 1024) -> Shapes:
    """Parameter name -> shape of a GPT-2 shaped model (GPT-2 small: 50257, 768, 12)."""
    shapes: Shapes = {"wte.weight": (vocab, d), "wpe.weight": (positions, d)}
    for i in range(layers):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
                       p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
                       p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                       p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
                       p + "mlp.c_fc.weight": (d, 4 * d), p + "mlp.c_fc.bias": (4 * d,),
                       p + "mlp.c_proj.weight": (4 * d, d), p + "mlp.c_proj.bias": (d,)})
    shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    return shapes


def state_of(shapes: Shapes, seed: int = 0) -> dict[str, Any]:
    """The model state and Adam state (both moments, a step) of these shapes, fp32, random."""
    g = torch.Generator().manual_seed(seed)
    model = {k: torch.rand(s, generator=g) for k, s in shapes.items()}
    optim = {k: {"step": torch.tensor(100.0), "exp_avg": torch.rand(s, generator=g),
                 "exp_avg_sq": torch.rand(s, generator=g)} for k, s in shapes.items()}
    return {"model": model, "optim": {"state": optim}}


def make_state(size_mb: float, seed: int = 0) -> dict[str, Any]:
    """A GPT-2 shaped model state and Adam state (named), fp32, about size_mb MB in all."""
    params_bytes = size_mb * 1e6 / 3  # parameters + exp_avg + exp_avg_sq
    d = 768
    per_layer = 12 * d * d + 13 * d  # qkv, proj, mlp in/out, biases and norms
    layers = max(1, int((params_bytes / 4 - 50257 * d - 1024 * d) / per_layer))
    vocab = 50257
    if params_bytes / 4 < vocab * d + 1024 * d + per_layer:  # small: shrink the vocabulary
        vocab = max(1000, int(params_bytes / 4 / d) - 1024 - 12 * d)
    return state_of(gpt2_shapes(vocab, d, layers), seed)


def tensors_of(state: dict[str, Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in state.values():
        out.extend(tensors_of(v) if isinstance(v, dict) else [v])
    return out


def state_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(state))


def proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def drop_page_cache(path: str) -> None:
    """Drops the cached pages of every file under path (so the next read is from the disk)."""
    files = [path] if os.path.isfile(path) else [
        os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def wait_dcp_async(result: Any, t0: float) -> float:
    """Waits for a DCP ``async_save`` result; returns its stall: the time from ``t0`` until
    the state may change (with a stager staging in the background, until its staging is
    done; else until the call returned)."""
    if hasattr(result, "staging_completion"):  # AsyncSaveResponse: staging in background
        result.staging_completion.result()
        stall = time.perf_counter() - t0
        result.upload_completion.result()
    else:
        stall = time.perf_counter() - t0
        result.result()
    return stall


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Method:
    """One way to save; save() returns (stall_s, durable_s, path); load(path) loads in place."""

    engine: str | None = None

    def __init__(self, name: str, state: dict[str, Any], workdir: str) -> None:
        self.name, self.state, self.workdir = name, state, workdir

    def path(self, i: int) -> str:
        return os.path.join(self.workdir, f"{self.name}-{i}")

    def save(self, i: int) -> tuple[float, float, str]:
        raise NotImplementedError

    def load(self, path: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TorchSave(Method):
    def save(self, i: int) -> tuple[float, float, str]:
        path = self.path(i) + ".pt"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.workdir)
        total = time.perf_counter() - t0
        return total, total, path

    def load(self, path: str) -> None:
        loaded = torch.load(path, weights_only=True)
        for dst, src in zip(tensors_of(self.state), tensors_of(loaded)):
            dst.copy_(src)


class DcpSave(Method):
    def __init__(self, name: str, state: dict[str, Any], workdir: str) -> None:
        super().__init__(name, state, workdir)
        import torch.distributed.checkpoint as dcp
        self.dcp = dcp

    def save(self, i: int) -> tuple[float, float, str]:
        path = self.path(i)
        t0 = time.perf_counter()
        self.dcp.save(self.state, checkpoint_id=path, no_dist=True)
        total = time.perf_counter() - t0
        return total, total, path

    def load(self, path: str) -> None:
        self.dcp.load(self.state, checkpoint_id=path, no_dist=True)


class DcpAsync(DcpSave):
    def __init__(self, name: str, state: dict[str, Any], workdir: str) -> None:
        super().__init__(name, state, workdir)
        from torch.distributed.checkpoint import staging
        self.kwargs: dict[str, Any] = {}
        self.stager: Any = None
        if name == "dcp.async.stager":
            # The reusable pinned stager (pinned memory needs CUDA: off on a CPU-only machine).
            pinned = torch.cuda.is_available()
            self.stager = staging.DefaultStager(staging.StagingOptions(
                use_pinned_memory=pinned, use_shared_memory=True, use_async_staging=True,
                use_non_blocking_copy=pinned))
            self.kwargs["async_stager"] = self.stager

    def save(self, i: int) -> tuple[float, float, str]:
        path = self.path(i)
        kwargs = dict(self.kwargs)
        if self.name == "dcp.async.cached":
            kwargs["storage_writer"] = self.dcp.FileSystemWriter(path, cache_staged_state_dict=True)
        t0 = time.perf_counter()
        result = self.dcp.async_save(self.state, checkpoint_id=path, no_dist=True, **kwargs)
        stall = wait_dcp_async(result, t0)
        return stall, time.perf_counter() - t0, path

    def close(self) -> None:
        if self.stager is not None:
            self.stager.close()


class Tsnap(Method):
    def __init__(self, name: str, state: dict[str, Any], workdir: str) -> None:
        super().__init__(name, state, workdir)
        import tsnap
        self.tsnap = tsnap
        self.snap = tsnap.Snapshotter(workdir)
        self.dtype = torch.bfloat16 if name == "tsnap.bf16" else None

    def save(self, i: int) -> tuple[float, float, str]:
        name = f"{self.name}-{i}"
        t0 = time.perf_counter()
        h = self.snap.save_async(name, self.state, dtype=self.dtype)
        stall = time.perf_counter() - t0
        h.wait()
        total = time.perf_counter() - t0
        self.engine = h.stats.engine + ("+O_DIRECT" if h.stats.direct else "")
        return stall, total, h.path

    def load(self, path: str) -> None:
        self.tsnap.load_into(path, self.state)

    def close(self) -> None:
        self.snap.close()


CLASSES: dict[str, type[Method]] = {
    "torch.save": TorchSave, "dcp.save": DcpSave, "dcp.async": DcpAsync,
    "dcp.async.cached": DcpAsync, "dcp.async.stager": DcpAsync, "tsnap": Tsnap,
    "tsnap.bf16": Tsnap}


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def run_worker(method: str, size_mb: float, repeat: int, workdir: str) -> dict[str, Any]:
    warnings.simplefilter("ignore")
    state = make_state(size_mb)
    nbytes = state_bytes(state)
    gc.collect()
    rss_base = proc_status("VmRSS")
    reset_peak_rss()
    m = CLASSES[method](method, state, workdir)
    stalls: list[float] = []
    totals: list[float] = []
    rss: list[int] = []
    last: str | None = None
    for i in range(repeat):
        stall, total, path = m.save(i)
        stalls.append(stall)
        totals.append(total)
        rss.append(proc_status("VmRSS"))
        if last is not None:
            remove(last)
        last = path
    if last is None:
        raise ValueError("tsnap.bench: --repeat must be at least 1")
    peak = proc_status("VmHWM")
    drop_page_cache(last)
    t0 = time.perf_counter()
    m.load(last)
    load_s = time.perf_counter() - t0
    m.close()
    remove(last)
    return {"method": method, "label": METHODS[method], "bytes": nbytes, "repeat": repeat,
            "stall_s": stalls, "durable_s": totals, "rss_after_save": rss,
            "rss_base": rss_base, "rss_peak": peak, "load_s": load_s,
            "engine": getattr(m, "engine", None), "torch": torch.__version__}


def summarize(r: dict[str, Any]) -> dict[str, float]:
    med = statistics.median
    return {"stall_s": med(r["stall_s"]), "durable_s": med(r["durable_s"]),
            "gbps": r["bytes"] / med(r["durable_s"]) / 1e9,
            "growth_mb": (r["rss_after_save"][-1] - r["rss_after_save"][0]) / 1e6,
            "peak_mb": (r["rss_peak"] - r["rss_base"]) / 1e6, "load_s": r["load_s"]}


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| method | stall s | durable s | GB/s | RSS growth MB (save 1 -> last) | "
             "peak extra RSS MB | load s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['label']} | failed: {r['error']} | | | | | |")
            continue
        s = summarize(r)
        lines.append(f"| {r['label']} | {s['stall_s']:.3f} | {s['durable_s']:.3f} | "
                     f"{s['gbps']:.2f} | {s['growth_mb']:+.0f} | {s['peak_mb']:.0f} | "
                     f"{s['load_s']:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tsnap.bench``: parses ``argv`` (default: the command line's arguments), runs
    the benchmark it names and prints its table; returns the exit status (0)."""
    from . import _dist
    p = argparse.ArgumentParser(prog="python -m tsnap.bench",
                                description=__doc__ + "\n" + _dist.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=int, default=256, help="state size in MB (default 256)")
    p.add_argument("--repeat", "--reps", type=int, default=None,
                   help="saves per method (default 5; 3 with --ranks)")
    p.add_argument("--ranks", type=int, default=0,
                   help="N >= 2: N ranks on this machine (Gloo on CPU), tsnap vs DCP, in the "
                   "replicated and the row-sharded layout (described above)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="with --ranks and --cuda: the state is this times GPT-2 small + Adam "
                   "(1.49 GB)")
    p.add_argument("--layouts", default="replicated,sharded",
                   help="with --ranks: comma-separated, of: replicated, sharded")
    p.add_argument("--reuse-ranks", action="store_true",
                   help="with --ranks: run every method in the same N processes, one after "
                   "the other (quicker to start; for smoke tests, not for figures)")
    p.add_argument("--timeout", type=float, default=1800,
                   help="with --ranks: seconds before the ranks of one method are killed")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory "
                   "under the current one, removed afterwards)")
    # DCP's cached staging pins memory, which needs CUDA.
    default = [m for m in METHODS if m != "dcp.async.cached" or torch.cuda.is_available()]
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, of: {', '.join(METHODS)} (default: "
                   f"{','.join(default)}); with --ranks, of: {', '.join(_dist.METHODS)} "
                   f"(default: {','.join(_dist.default_methods())})")
    p.add_argument("--loop", action="store_true",
                   help="measure what periodic snapshots cost a training loop (paired blocks "
                   "with and without a snapshot; see tsnap/bench/_loop.py); with --size-mb, "
                   "--pairs, --block")
    p.add_argument("--pairs", type=int, default=None,
                   help="with --loop: block pairs (default 30); with --cuda: 10")
    p.add_argument("--block", type=int, default=None,
                   help="with --loop: training steps per block (default 20); with --cuda: 50")
    p.add_argument("--stagings", default="eager,lazy,copy",
                   help="with --loop: comma-separated runs, of eager, lazy and copy (the "
                   "no-snapshot floor); default: all three")
    p.add_argument("--cuda", action="store_true",
                   help="the state on the GPU: stall, durable and load_into against the pinned "
                   "copies of the same bytes, and a GPU training loop (tsnap/bench/_cuda.py); "
                   "with --scale, --repeat (default 5), --pairs, --block, --loop-mb, "
                   "--loop-batch, --no-loop. Without a GPU it says so and exits with 0")
    p.add_argument("--loop-mb", type=int, default=1500,
                   help="with --cuda: MB of parameters and Adam moments of the training loop "
                   "(default 1500)")
    p.add_argument("--loop-batch", type=int, default=1024,
                   help="with --cuda: batch size of the training loop (default 1024)")
    p.add_argument("--no-loop", action="store_true", help="with --cuda: skip the training loop")
    p.add_argument("--json", default=None, help="also write every figure to this file")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--trainers", nargs="?", const=",".join(("lightning", "accelerate",
                                                          "transformers")), default=None,
                   help="a checkpoint save in each trainer (comma-separated, of lightning, "
                   "accelerate, transformers; default all) through tsnap and through the "
                   "trainer's own writer, GPT-2 small + AdamW (1.5 GB), --repeat saves "
                   "(default 3); tsnap/bench/_trainers.py")
    args = p.parse_args(argv)

    if args.trainers:
        from . import _trainers
        args.repeat = args.repeat or 3
        unknown = set(args.trainers.split(",")) - set(_trainers.TRAINERS)
        if unknown:
            p.error(f"--trainers takes {', '.join(_trainers.TRAINERS)}, not "
                    f"{','.join(sorted(unknown))}")
        saves = _trainers.main(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(saves, f, indent=1)
        return 0
    if args.cuda:
        from . import _cuda
        if not 0 < args.scale <= 1:
            p.error("--scale must be in (0, 1]")
        args.pairs = args.pairs or 10
        figures = _cuda.main(args)
        if args.json and figures is not None:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=1)
        return 0
    if args.loop:
        from . import _loop
        args.pairs = args.pairs or 30
        args.block = args.block or 20
        args.stagings = [x for x in args.stagings.split(",") if x]
        unknown = set(args.stagings) - {"eager", "lazy", "copy"}
        if unknown or not args.stagings:
            p.error(f"--stagings takes eager, lazy and copy, not {','.join(sorted(unknown))}")
        runs = _loop.main(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(runs, f, indent=1)
        return 0
    if args.ranks:
        if args.ranks < 2:
            p.error("--ranks needs at least 2 ranks")
        if not 0 < args.scale <= 1:
            p.error("--scale must be in (0, 1]")
        args.repeat = args.repeat or 3
        args.layouts = [x for x in args.layouts.split(",") if x]
        methods = (args.methods.split(",") if args.methods else _dist.default_methods())
        for name in args.layouts:
            if name not in _dist.LAYOUTS:
                p.error(f"unknown layout '{name}'")
        for m in methods:
            if m not in _dist.METHODS:
                p.error(f"unknown method '{m}' for --ranks")
        report = _dist.run(args, methods)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        return 0
    args.repeat = args.repeat or 5
    args.methods = args.methods or ",".join(default)
    if args.worker:
        print(json.dumps(run_worker(args.worker, args.size_mb, args.repeat, args.dir)))
        return 0
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            p.error(f"unknown method '{m}'")
    os.makedirs(args.dir or ".", exist_ok=True)
    top = tempfile.mkdtemp(prefix="tsnap-bench-", dir=args.dir or ".")
    results: list[dict[str, Any]] = []
    try:
        for m in methods:
            workdir = os.path.join(top, m)
            os.makedirs(workdir)
            cmd = [sys.executable, "-m", "tsnap.bench", "--worker", m, "--size-mb",
                   str(args.size_mb), "--repeat", str(args.repeat), "--dir", workdir]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                err = (r.stderr.strip().splitlines() or ["?"])[-1][:120]
                results.append({"method": m, "label": METHODS[m], "error": err})
            else:
                results.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(f"{m}: done", file=sys.stderr)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    ok = [r for r in results if "error" not in r]
    if ok:
        print(f"state: {ok[0]['bytes'] / 1e9:.2f} GB (GPT-2 shaped model + Adam moments, fp32), "
              f"{args.repeat} saves per method, medians; torch {ok[0]['torch']}; tsnap engine "
              f"{next((r['engine'] for r in ok if r['engine']), '-')}")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0

