"""``python -m tsnap.bench --trainers``: a checkpoint save in each trainer, through tsnap and
through the trainer's own writer, on the same state.

The state is GPT-2 small (124 M parameters, fp32) with AdamW's two moments after one step, about
1.5 GB, built once per trainer in its own process. Each writer saves it ``--repeat`` times, with
one training step (about 1 s on one core) before each save:

  stall    how long the training thread waits in the trainer's save call
  durable  from the call until the checkpoint is on disk: the writer's own wait (tsnap's commit,
           AsyncCheckpointIO's thread) and an fsync of every file it wrote

Writers: Lightning (the ``CheckpointIO`` calls the Trainer makes): ``TorchCheckpointIO`` (its
default), ``AsyncCheckpointIO`` over it, ``tsnap.lightning.TsnapCheckpointIO``; Accelerate:
``accelerator.save_state`` and ``tsnap.accelerate.save_state``; transformers: the Trainer's
checkpoint save (``Trainer._save_checkpoint``, as at every ``save_steps``) and
``tsnap.transformers.TsnapTrainer``'s. The first save and the median of the later ones are
reported apart. tsnap's staging buffers are made after the first optimizer step (transformers,
Accelerate), or reserved then and faulted in while training goes on (Lightning's CheckpointIO,
which learns the directory only at the first save: ``tsnap.reserve_staging``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

import torch

TRAINERS = ("lightning", "accelerate", "transformers")
WRITERS = {
    "lightning": ("torch", "async", "tsnap"),
    "accelerate": ("default", "tsnap"),
    "transformers": ("default", "tsnap"),
}


def _fsync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _gpt2() -> tuple[Any, torch.optim.Optimizer, Callable[[], None]]:
    """GPT-2 small, an AdamW that has taken one step (its moments exist), and a training step
    (forward, backward and optimizer step on a batch of 8 tokens: about 1 s on one core)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (1, 8))

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    return model, opt, step


def _state_bytes(model: Any, opt: torch.optim.Optimizer) -> int:
    n: int = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for s in opt.state.values():
        n += sum(t.numel() * t.element_size() for t in s.values() if torch.is_tensor(t))
    return n


def _measure(repeat: int, save: Callable[[int], str], durable: Callable[[str], None],
             step: Callable[[], None]) -> dict[str, Any]:
    stalls, durables = [], []
    for i in range(repeat):
        step()  # training moved on
        t0 = time.perf_counter()
        path = save(i)
        t1 = time.perf_counter()
        durable(path)
        t2 = time.perf_counter()
        stalls.append(t1 - t0)
        durables.append(t2 - t0)
    later_s, later_d = stalls[1:] or stalls, durables[1:] or durables
    return {"first_stall": stalls[0], "stall": statistics.median(later_s),
            "first_durable": durables[0], "durable": statistics.median(later_d),
            "stalls": stalls, "durables": durables}


def _lightning(writer: str, repeat: int, workdir: str) -> dict[str, Any]:
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    from tsnap.lightning import TsnapCheckpointIO
    makers: dict[str, Callable[[], Any]] = {
        "torch": TorchCheckpointIO, "tsnap": TsnapCheckpointIO,
        "async": lambda: AsyncCheckpointIO(TorchCheckpointIO())}
    io = makers[writer]()  # before training, as the Trainer's plugins are
    model, opt, step = _gpt2()

    def save(i: int) -> str:
        path = os.path.join(workdir, f"epoch=0-step={i}.ckpt")
        io.save_checkpoint({"state_dict": model.state_dict(),
                            "optimizer_states": [opt.state_dict()], "epoch": 0,
                            "global_step": i, "pytorch-lightning_version": "2.6.6",
                            "loops": {}, "callbacks": {}, "lr_schedulers": []}, path)
        return path

    def durable(path: str) -> None:
        if writer == "tsnap":
            io.wait()
            return
        if writer == "async":
            io.teardown()  # waits for its thread (a later save makes a new one)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    out = _measure(repeat, save, durable, step)
    if writer == "tsnap":
        io.teardown()
    out["bytes"] = _state_bytes(model, opt)
    return out


def _accelerate(writer: str, repeat: int, workdir: str) -> dict[str, Any]:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    import tsnap.accelerate
    model, opt, step = _gpt2()
    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=workdir, automatic_checkpoint_naming=True))
    model, opt = acc.prepare(model, opt)
    if writer == "tsnap":
        # What a checkpointer made after prepare() does after the first optimizer step.
        tsnap.accelerate.checkpointer(acc)._after_step()

    def save(i: int) -> str:
        if writer == "tsnap":
            return tsnap.accelerate.save_state(acc)
        return str(acc.save_state())

    def durable(path: str) -> None:
        if writer == "tsnap":
            tsnap.accelerate.wait(acc)
        else:
            _fsync_tree(path)

    out = _measure(repeat, save, durable, step)
    if writer == "tsnap":
        tsnap.accelerate.checkpointer(acc).close()
    out["bytes"] = _state_bytes(model, opt)
    return out


def _transformers(writer: str, repeat: int, workdir: str) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    from tsnap.transformers import TsnapTrainer
    model, opt, step = _gpt2()
    args = TrainingArguments(output_dir=workdir, use_cpu=True, report_to=[], save_steps=1,
                             save_total_limit=None, disable_tqdm=True)
    cls = TsnapTrainer if writer == "tsnap" else Trainer
    trainer: Any = cls(model=model, args=args, optimizers=(opt, None))
    trainer.create_optimizer_and_scheduler(num_training_steps=repeat + 1)
    if writer == "tsnap":
        trainer._tsnap_prepare()  # what the Trainer does after the first optimizer step

    def save(i: int) -> str:
        trainer.state.global_step = i + 1
        trainer._save_checkpoint(model, trial=None)
        return os.path.join(workdir, f"checkpoint-{i + 1}")

    def durable(path: str) -> None:
        if writer == "tsnap":
            trainer.wait_for_checkpoints()
        else:
            _fsync_tree(path)

    out = _measure(repeat, save, durable, step)
    if writer == "tsnap":
        trainer.close_checkpoints()
    out["bytes"] = _state_bytes(model, opt)
    return out


def run_worker(trainer: str, writer: str, repeat: int, workdir: str) -> dict[str, Any]:
    """One trainer's writer, in this process: the figures of its saves."""
    warnings.simplefilter("ignore")
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    fn = {"lightning": _lightning, "accelerate": _accelerate,
          "transformers": _transformers}[trainer]
    out = fn(writer, repeat, workdir)
    out.update(trainer=trainer, writer=writer)
    return out


def main(args: Any) -> list[dict[str, Any]]:
    """Runs every trainer's writers, each in its own process; prints the table."""
    trainers = [t for t in (args.trainers or ",".join(TRAINERS)).split(",") if t]
    results: list[dict[str, Any]] = []
    top = tempfile.mkdtemp(prefix="tsnap-bench-trainers-", dir=args.dir or ".")
    try:
        for trainer in trainers:
            for writer in WRITERS[trainer]:
                workdir = os.path.join(top, f"{trainer}-{writer}")
                os.makedirs(workdir)
                cmd = [sys.executable, "-c",
                       "import json, sys; from tsnap.bench import _trainers as t; "
                       "print(json.dumps(t.run_worker(*sys.argv[1:3], int(sys.argv[3]), "
                       "sys.argv[4])))", trainer, writer, str(args.repeat), workdir]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    err = (r.stderr.strip().splitlines() or ["?"])[-1][:160]
                    results.append({"trainer": trainer, "writer": writer, "error": err})
                else:
                    results.append(json.loads(r.stdout.strip().splitlines()[-1]))
                shutil.rmtree(workdir, ignore_errors=True)
                print(f"{trainer} {writer}: done", file=sys.stderr)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(table(results, args.repeat))
    return results


def table(results: list[dict[str, Any]], repeat: int) -> str:
    lines = [f"{repeat} saves per writer; 'later' is the median of saves 2..{repeat}",
             "| trainer | writer | state GB | stall, first | stall, later | durable, first | "
             "durable, later |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['trainer']} | {r['writer']} | error: {r['error']} | | | | |")
            continue
        lines.append(f"| {r['trainer']} | {r['writer']} | {r['bytes'] / 1e9:.2f} | "
                     f"{r['first_stall']:.3f} s | {r['stall']:.3f} s | "
                     f"{r['first_durable']:.3f} s | {r['durable']:.3f} s |")
    return "\n".join(lines)
