"""``python -m tsnap.bench --ranks N``: the same state saved by N ranks with tsnap and with DCP.

N processes on this machine (Gloo on CPU, one thread each: ``torch.set_num_threads(1)``,
OMP_NUM_THREADS=1) hold a GPT-2 small shaped model and its Adam moments, fp32 (1.49 GB in all
at ``--scale 1``; ``--scale S`` scales every dimension so the state is S times that), in two
layouts:

  replicated  every rank holds all of it (DDP); plain tensors, which tsnap and DCP both write
              once across the ranks, spreading the bytes over them
  sharded     every rank holds rows of each tensor (DTensor ``Shard(0)`` on a 1-D mesh of the
              N ranks, as FSDP2 does; Adam's step counters stay replicated)

Each method runs in its own N processes and saves the state ``--reps`` times; the ranks start
each save together (a barrier) and the slowest rank gives each figure:

  stall    how long the call blocks the training thread before the tensors may change (for a
           DCP stager that stages in the background: the call plus its staging future). The
           first save (buffers allocated, pages touched) is reported apart from the later ones
  durable  from the call until the checkpoint is on disk and committed. tsnap: the handle's
           wait() (rank 0 commits once every rank's files are fsynced). DCP: FileSystemWriter's
           sync_files=True fsyncs every data file and the .metadata file; rank 0 then fsyncs
           the checkpoint directory and its parent, inside the timed interval
  GB/s     the state's bytes (all ranks together, each tensor once) / durable
  written  bytes of the files each rank wrote (smallest and largest rank)
  memcpy   the floor: every rank at once copies its tensors (one thread) into preallocated,
           already touched tensors; the median of 3. "held" copies all the tensors the rank
           holds, "written" one flat buffer of the bytes it wrote. stall / memcpy is each
           rank's own ratio, the largest over the ranks

The DCP stagers are those of the installed torch that run on a CPU: the default (a fresh
unpinned copy per save), a reused ``DefaultStager`` staging in place (its copies cached from
the second save on) and one staging on a background thread (the stall waits for it). The
pinned stagers (``FileSystemWriter(cache_staged_state_dict=True)``, pinned ``StagingOptions``)
need CUDA and run only where it is available. Restore: the last snapshot of tsnap and of
``dcp.save`` loaded on N/2 ranks (one process for N = 2) into the same layout, with the page
cache of its files dropped first, and compared bitwise with the saved state; its time is the
slowest rank's, its GB/s the bytes loaded into all the ranks' tensors / that time.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .. import bench

LAYOUTS = {"replicated": "replicated (DDP)", "sharded": "row-sharded (DTensor Shard(0))"}

METHODS = {
    "tsnap": "tsnap save_async",
    "dcp.save": "DCP save",
    "dcp.async": "DCP async_save (default stager)",
    "dcp.async.reused": "DCP async_save (DefaultStager reused, blocking)",
    "dcp.async.stager": "DCP async_save (DefaultStager reused, background staging)",
    "dcp.async.cached": "DCP async_save (FileSystemWriter cache_staged_state_dict, pinned)",
    "dcp.async.pinned": "DCP async_save (DefaultStager pinned, background staging)",
}
NEEDS_CUDA = ("dcp.async.cached", "dcp.async.pinned")
ASYNC_DCP = [m for m in METHODS if m.startswith("dcp.async")]


def default_methods() -> list[str]:
    return [m for m in METHODS if m not in NEEDS_CUDA or torch.cuda.is_available()]


def shapes_for(scale):
    """GPT-2 small's shapes with every dimension times sqrt(scale) (the bytes times scale)."""
    r = math.sqrt(scale)
    d = 768 if scale == 1 else max(8, round(768 * r / 8) * 8)
    return bench.gpt2_shapes(vocab=max(8, round(50257 * r)), d=d, layers=12,
                             positions=max(8, round(1024 * r)))


def rows_of(t, rank, world):
    """This rank's rows of t, as DTensor Shard(0) cuts them (torch.chunk; maybe empty)."""
    pieces = torch.chunk(t, world, dim=0)
    return pieces[rank].clone() if rank < len(pieces) else t[:0].clone()


def build_state(layout, scale, rank, world, zeros=False):
    """(state this rank holds, the global state it is cut from)."""
    full = bench.state_of(shapes_for(scale))
    if zeros:
        local = map_tensors(full, torch.zeros_like)
    else:
        local = full
    if layout == "replicated" or world == 1:
        return local, full
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    mesh = init_device_mesh("cpu", (world,))

    def shard(t):
        if t.dim() == 0:
            return t.clone()
        return DTensor.from_local(rows_of(t, rank, world), mesh, [Shard(0)], run_check=False,
                                  shape=t.shape, stride=t.stride())

    return map_tensors(local, shard), full


def map_tensors(state, fn):
    return {k: map_tensors(v, fn) if isinstance(v, dict) else fn(v) for k, v in state.items()}


def local_tensors(state):
    """The tensors a rank holds (a DTensor's local piece)."""
    return [t.to_local() if hasattr(t, "to_local") else t for t in bench.tensors_of(state)]


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def memcpy_floor(tensors, repeat=3):
    """Median time of one-thread copies of tensors into preallocated, touched tensors."""
    dst = [torch.empty_like(t) for t in tensors]
    for d, s in zip(dst, tensors):
        d.copy_(s)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for d, s in zip(dst, tensors):
            d.copy_(s)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Tsnap:
    def __init__(self, name, state, workdir, world):
        import tsnap
        self.tsnap = tsnap
        self.stage_threads = max(1, (os.cpu_count() or 1) // world)
        self.snap = tsnap.Snapshotter(workdir, group=tsnap.DistGroup(timeout=600),
                                      stage_threads=self.stage_threads)
        # As a training script does before its loop (PeriodicSnapshots does at its first step): the
        # staging buffers sized and faulted in, so that the first save stalls like the later.
        t0 = time.perf_counter()
        self.snap.prepare(state)
        self.prepare_s = time.perf_counter() - t0
        self.state = state
        self.engine = None
        self.stats = []

    def save(self, i):
        t0 = time.perf_counter()
        h = self.snap.save_async(f"tsnap-{i}", self.state)
        stall = time.perf_counter() - t0
        h.wait()
        durable = time.perf_counter() - t0
        st = h.stats
        self.engine = st.engine + ("+O_DIRECT" if st.direct else "")
        self.stats.append({k: getattr(st, k) for k in (
            "stall_s", "stage_s", "write_s", "commit_s", "total_s", "bytes", "written_bytes",
            "files", "buffer_waits", "buffers_reused")})
        return stall, durable, h.path

    @staticmethod
    def written(path, rank):
        with open(os.path.join(path, "MANIFEST.json")) as f:
            files = json.load(f)["files"]
        return sum(os.path.getsize(os.path.join(path, name))
                   for name, info in files.items() if info.get("rank", 0) == rank)

    def close(self):
        self.snap.close()


class Dcp:
    def __init__(self, name, state, workdir, world):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import staging
        self.dcp, self.name, self.state, self.workdir = dcp, name, state, workdir
        self.stager = None
        self.engine = None
        options = {"dcp.async.reused": (False, False, False, False),
                   "dcp.async.stager": (False, True, True, False),
                   "dcp.async.pinned": (True, True, True, True)}.get(name)
        if options is not None:
            self.stager = staging.DefaultStager(staging.StagingOptions(*options))

    def save(self, i):
        path = os.path.join(self.workdir, f"{self.name}-{i}")
        t0 = time.perf_counter()
        if self.name == "dcp.save":
            self.dcp.save(self.state, checkpoint_id=path)
            stall = time.perf_counter() - t0
        else:
            kwargs = {}
            if self.stager is not None:
                kwargs["async_stager"] = self.stager
            if self.name == "dcp.async.cached":
                kwargs["storage_writer"] = self.dcp.FileSystemWriter(
                    path, cache_staged_state_dict=True)
            result = self.dcp.async_save(self.state, checkpoint_id=path, **kwargs)
            stall = bench.wait_dcp_async(result, t0)
        if int(os.environ["RANK"]) == 0:
            bench.fsync_dir(path)
            bench.fsync_dir(self.workdir)
        return stall, time.perf_counter() - t0, path

    @staticmethod
    def written(path, rank):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                   if f.startswith(f"__{rank}_") and f.endswith(".distcp")) + (
            os.path.getsize(os.path.join(path, ".metadata")) if rank == 0 else 0)

    def close(self):
        if self.stager is not None:
            self.stager.close()


def init_dist(world):
    import torch.distributed as dist
    if world > 1:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    return dist


def save_job(cfg, dist, rank, world):
    """One rank of one method: reps saves, then the memcpy floors; returns its figures."""
    state, full = build_state(cfg["layout"], cfg["scale"], rank, world)
    global_bytes = nbytes(bench.tensors_of(full))
    del full
    gc.collect()
    held = local_tensors(state)
    method = cfg["method"]
    m = (Tsnap if method == "tsnap" else Dcp)(method, state, cfg["workdir"], world)
    stalls, durables, written = [], [], []
    last = None
    for i in range(cfg["reps"]):
        dist.barrier()
        stall, durable, path = m.save(i)
        stalls.append(stall)
        durables.append(durable)
        dist.barrier()  # every rank done: the snapshot is committed, its files complete
        written.append(m.written(path, rank))
        if last is not None and rank == 0:
            bench.remove(last)
        last = path
    m.close()
    dist.barrier()
    floor_held = memcpy_floor(held)
    dist.barrier()
    flat = torch.ones(max(1, written[-1]), dtype=torch.uint8)
    floor_written = memcpy_floor([flat])
    del flat
    dist.barrier()
    out = {"rank": rank, "stall_s": stalls, "durable_s": durables, "written": written,
           "held": nbytes(held), "global_bytes": global_bytes, "memcpy_held_s": floor_held,
           "memcpy_written_s": floor_written, "path": last, "engine": m.engine}
    if isinstance(m, Tsnap):
        out["stage_threads"] = m.stage_threads
        out["tsnap_stats"] = m.stats
        out["prepare_s"] = m.prepare_s
    return out


def load_job(cfg, dist, rank, world):
    """One rank of a restore: loads cfg["path"] into zeros of this rank's layout; times it
    and compares bitwise with the saved state."""
    state, full = build_state(cfg["layout"], cfg["scale"], rank, world, zeros=True)
    if rank == 0:
        bench.drop_page_cache(cfg["path"])
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    if cfg["format"] == "tsnap":
        import tsnap
        tsnap.load_into(cfg["path"], state)
    else:
        import torch.distributed.checkpoint as dcp
        dcp.load(state, checkpoint_id=cfg["path"], no_dist=world == 1)
    seconds = time.perf_counter() - t0
    expect = full if cfg["layout"] == "replicated" or world == 1 else map_tensors(
        full, lambda t: t if t.dim() == 0 else rows_of(t, rank, world))
    equal = all(torch.equal(a, b) for a, b in zip(local_tensors(state),
                                                  bench.tensors_of(expect)))
    if world > 1:
        dist.barrier()
    return {"rank": rank, "seconds": seconds, "bytes": nbytes(local_tensors(state)),
            "bitwise": equal}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world, cfg, outdir, timeout):
    """Runs world ranks of cfg (its jobs one after the other); returns each job's list of the
    ranks' results, or raises RuntimeError with the first failing rank's last line. Kills
    every rank after timeout, and the others 30 s after one fails."""
    cfg_path = os.path.join(outdir, f"{cfg['role']}-{time.monotonic_ns()}.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tsnap.bench._dist", cfg_path], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline, failed_at = time.monotonic() + timeout, None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + 30):
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
    outputs = [p.communicate()[0] for p in procs]
    results = []
    for rank, (p, text) in enumerate(zip(procs, outputs)):
        lines = text.strip().splitlines()
        if p.returncode != 0 or not lines:
            why = "timed out" if p.returncode in (-9, None) and failed_at is None else (
                lines[-1][:160] if lines else f"exit {p.returncode}")
            raise RuntimeError(f"rank {rank}: {why}")
        results.append(json.loads(lines[-1]))
    return [[r[j] for r in results] for j in range(len(cfg["jobs"]))]


def median_range(values):
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(ranks):
    """The figures of one method and layout, from its ranks' results."""
    reps = len(ranks[0]["stall_s"])
    stall = [max(r["stall_s"][i] for r in ranks) for i in range(reps)]
    durable = [max(r["durable_s"][i] for r in ranks) for i in range(reps)]
    per_held = [max(r["stall_s"][i] / r["memcpy_held_s"] for r in ranks) for i in range(reps)]
    per_written = [max(r["stall_s"][i] / r["memcpy_written_s"] for r in ranks)
                   for i in range(reps)]
    written = [r["written"][-1] for r in ranks]
    d = median_range(durable)
    return {
        "stall_first_s": stall[0], "stall_later_s": median_range(stall[1:]),
        "durable_s": d, "gbps": ranks[0]["global_bytes"] / d["median"] / 1e9,
        "held_per_rank": [r["held"] for r in ranks], "written_per_rank": written,
        "memcpy_held_s": [r["memcpy_held_s"] for r in ranks],
        "memcpy_written_s": [r["memcpy_written_s"] for r in ranks],
        "stall_over_memcpy_held": {"first": per_held[0], "later": median_range(per_held[1:])},
        "stall_over_memcpy_written": {"first": per_written[0],
                                      "later": median_range(per_written[1:])},
    }


def fmt_range(r, digits=3):
    if r is None:
        return "-"
    return f"{r['median']:.{digits}f} [{r['min']:.{digits}f}-{r['max']:.{digits}f}]"


def fmt_ratio(x):
    first = f"{x['first']:.2f}"
    return first + (f" / {x['later']['median']:.2f}" if x["later"] else "")


def table(rows):
    lines = ["| method | held/rank MB | written/rank MB | memcpy held s | first stall s | "
             "later stall s | stall/memcpy held (first / later) | "
             "stall/memcpy written (first / later) | durable s | GB/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | failed: {r['error']} |" + " |" * 9)
            continue
        s = r["summary"]
        w = s["written_per_rank"]
        lines.append(
            f"| {r['label']} | {max(s['held_per_rank']) / 1e6:.0f} | "
            f"{min(w) / 1e6:.0f}-{max(w) / 1e6:.0f} | {max(s['memcpy_held_s']):.3f} | "
            f"{s['stall_first_s']:.3f} | {fmt_range(s['stall_later_s'])} | "
            f"{fmt_ratio(s['stall_over_memcpy_held'])} | "
            f"{fmt_ratio(s['stall_over_memcpy_written'])} | {fmt_range(s['durable_s'])} | "
            f"{s['gbps']:.2f} |")
    return "\n".join(lines)


def run(args: argparse.Namespace, methods: list[str]) -> dict[str, Any]:
    """The launcher: every layout and method, then the restores; prints and returns the
    report (a dict, as --json writes it)."""
    world = args.ranks
    cores = os.cpu_count() or 1
    os.makedirs(args.dir or ".", exist_ok=True)
    top = tempfile.mkdtemp(prefix="tsnap-bench-dist-", dir=args.dir or ".")
    load_world = max(1, world // 2)
    rows = [{"layout": layout, "method": m, "label": METHODS[m]}
            for layout in args.layouts for m in methods]
    restores = [{"layout": layout, "format": fmt, "saved_by": world, "loaded_by": load_world}
                for layout in args.layouts for fmt, m in (("tsnap", "tsnap"), ("dcp", "dcp.save"))
                if m in methods]
    try:
        jobs = []
        for row in rows:
            workdir = os.path.join(top, row["layout"], row["method"])
            os.makedirs(workdir)
            jobs.append({"layout": row["layout"], "method": row["method"], "scale": args.scale,
                         "reps": args.repeat, "workdir": workdir})
        batches = [list(range(len(rows)))] if args.reuse_ranks else [[i] for i in range(len(rows))]
        for batch in batches:
            try:
                got = launch(world, {"role": "save", "jobs": [jobs[i] for i in batch]}, top,
                             args.timeout * len(batch))
                for i, ranks in zip(batch, got):
                    rows[i].update(ranks=ranks, summary=summarize(ranks))
            except RuntimeError as e:
                for i in batch:
                    rows[i]["error"] = str(e)
            for i in batch:
                if rows[i]["method"] not in ("tsnap", "dcp.save"):
                    shutil.rmtree(jobs[i]["workdir"], ignore_errors=True)
                print(f"{rows[i]['layout']} {rows[i]['method']}: "
                      f"{'failed: ' + rows[i]['error'] if 'error' in rows[i] else 'done'}",
                      file=sys.stderr, flush=True)
        saved = {(r["layout"], r["method"]): r["ranks"][0]["path"] for r in rows if "ranks" in r}
        todo = [r for r in restores
                if (r["layout"], "tsnap" if r["format"] == "tsnap" else "dcp.save") in saved]
        for r in restores:
            if r not in todo:
                r["error"] = "its save failed"
        load_jobs = [{"layout": r["layout"], "format": r["format"], "scale": args.scale,
                      "path": saved[(r["layout"], "tsnap" if r["format"] == "tsnap"
                                     else "dcp.save")]} for r in todo]
        batches = [list(range(len(todo)))] if args.reuse_ranks else [[i] for i in range(len(todo))]
        for batch in batches:
            try:
                got = launch(load_world, {"role": "load", "jobs": [load_jobs[i] for i in batch]},
                             top, args.timeout * len(batch))
                for i, ranks in zip(batch, got):
                    seconds = max(x["seconds"] for x in ranks)
                    todo[i].update(ranks=ranks, seconds=seconds,
                                   bitwise=all(x["bitwise"] for x in ranks),
                                   gbps=sum(x["bytes"] for x in ranks) / seconds / 1e9)
            except RuntimeError as e:
                for i in batch:
                    todo[i]["error"] = str(e)
            for i in batch:
                print(f"{todo[i]['layout']} restore {todo[i]['format']}: done", file=sys.stderr,
                      flush=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)

    ok = [r for r in rows if "error" not in r]
    gb = ok[0]["ranks"][0]["global_bytes"] / 1e9 if ok else 0
    engine = next((r["ranks"][0]["engine"] for r in ok if r["method"] == "tsnap"), "-")
    threads = next((r["ranks"][0]["stage_threads"] for r in ok if r["method"] == "tsnap"), "-")
    header = [f"{world} ranks (Gloo, 1 thread each for torch) on {cores} cores; state "
              f"{gb:.3f} GB (GPT-2 small shaped model + Adam moments, fp32, scale {args.scale}); "
              f"{args.repeat} saves per method; torch {torch.__version__}; tsnap engine {engine}, "
              f"stage_threads {threads} per rank",
              "stall and durable: the slowest rank per save; first stall = save 1, later = "
              "median [range] of saves 2.., durable = median [range] of all saves"]
    if args.reuse_ranks:
        header.append("note: --reuse-ranks: every method ran in the same processes, one after "
                      "the other (each method's figures include what the earlier ones left)")
    if world > cores:
        header.append(f"note: {world} ranks share {cores} cores: these figures measure the "
                      "ranks' contention for the cores, not what each rank gets on its own core")
    skipped = [m for m in NEEDS_CUDA if m not in methods]
    if skipped and not torch.cuda.is_available():
        header.append("not run (pinned memory needs CUDA): " + ", ".join(METHODS[m]
                                                                          for m in skipped))
    ratios = {}
    out = header[:]
    for layout in args.layouts:
        lrows = [r for r in rows if r["layout"] == layout]
        out += ["", f"{LAYOUTS[layout]}:", table(lrows)]
        ts = next((r for r in lrows if r["method"] == "tsnap" and "error" not in r), None)
        for r in lrows:
            if ts is None or "error" in r or r["method"] not in ASYNC_DCP:
                continue
            x = r["summary"]["durable_s"]["median"] / ts["summary"]["durable_s"]["median"]
            ratios[f"{layout}/{r['method']}"] = x
            out.append(f"tsnap durable aggregate vs {r['label']}: {x:.2f}x (target >= 2x)")
        if ts is not None:
            prep = max(x.get("prepare_s", 0.0) for x in ts["ranks"])
            out.append(f"tsnap prepare (staging buffers made and faulted in, once, before the "
                       f"first save): {prep:.3f} s (slowest rank)")
    out += ["", f"restore on {load_world} {'ranks' if load_world > 1 else 'process'} "
            "(page cache dropped first):",
            "| layout | snapshot | loaded by | s | GB/s | bitwise |",
            "|---|---|---:|---:|---:|---|"]
    for r in restores:
        if "error" in r:
            out.append(f"| {r['layout']} | {r['format']} | {r['loaded_by']} | failed: "
                       f"{r['error']} | | |")
        else:
            out.append(f"| {r['layout']} | {r['format']} (saved by {world}) | {r['loaded_by']} "
                       f"| {r['seconds']:.3f} | {r['gbps']:.2f} | {r['bitwise']} |")
    print("\n".join(out), flush=True)
    return {"ranks": world, "cores": cores, "scale": args.scale, "reps": args.repeat,
            "global_bytes": ok[0]["ranks"][0]["global_bytes"] if ok else None,
            "torch": torch.__version__, "machine": platform.platform(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "contention": world > cores, "reuse_ranks": args.reuse_ranks, "rows": rows,
            "restore": restores,
            "durable_ratio_dcp_async_over_tsnap": ratios}


def main(argv: Sequence[str] | None = None) -> int:
    """A rank: runs the jobs of the config file it is given; prints their results (JSON)."""
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    with open((argv or sys.argv[1:])[0]) as f:
        cfg = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist = init_dist(world)
    job = save_job if cfg["role"] == "save" else load_job
    out = [job(j, dist, rank, world) for j in cfg["jobs"]]
    if world > 1:
        dist.destroy_process_group()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
