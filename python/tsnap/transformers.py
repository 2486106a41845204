"""Hugging Face ``transformers`` Trainer checkpoints as tsnap snapshots: ``TsnapTrainer``, a
``Trainer`` that saves each ``checkpoint-<step>`` in the background::

    from tsnap.transformers import TsnapTrainer

    trainer = TsnapTrainer(model=model, args=TrainingArguments(
        output_dir="out", save_steps=500, save_total_limit=3), train_dataset=train_ds)
    trainer.train(resume_from_checkpoint=True)   # from the newest committed checkpoint, if any

Each checkpoint is a tsnap snapshot directory at the path the Trainer names
(``out/checkpoint-500/``), committed atomically: the model's state dict, the optimizer's, the LR
scheduler's, the GradScaler's, the RNG states (Python, NumPy, torch CPU and CUDA) and the
``TrainerState`` (what ``trainer_state.json`` holds: global step, log history, best metric,
stateful callbacks). Tensors go into safetensors shards, everything else into the manifest;
nothing is pickled. A value that a snapshot cannot hold is a tsnap.InvalidArgument naming its
key, before anything is written.

A save returns once the tensors are staged; the write and the commit run in the background.
``save_total_limit`` retention never removes a snapshot while a save is in flight (removals wait
for the saves started before them to commit, and are dropped if one fails), and keeps the newest
and the best checkpoint, as the Trainer does. ``train()`` waits for every save before it
returns and raises a failure; so does ``wait_for_checkpoints()``.

``train(resume_from_checkpoint=True)`` resumes from the newest committed ``checkpoint-<n>``
under ``output_dir`` (snapshots, or checkpoints the plain Trainer wrote, which load as
usual); ``resume_from_checkpoint="out/checkpoint-500"`` from that one.

Not covered: DeepSpeed, FSDP, several processes, ``load_best_model_at_end`` and
``push_to_hub`` (each refused by ``train()``); the snapshot does not hold ``config.json`` or a
tokenizer: ``trainer.save_model(dir)`` still writes a ``from_pretrained`` directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_callback import ExportableState, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy

from ._api import load, metadata
from ._integration import Saves, checked, is_snapshot, rng_state, set_rng_state

__all__ = ["RECORD_KEY", "TsnapTrainer"]

RECORD_KEY = "tsnap_transformers"
_RECORD_FORMAT = 1
_PREFIX = "tsnap.transformers"
_TRAINER_STATE_NAME = "trainer_state.json"
_NAME = re.compile(r"^" + PREFIX_CHECKPOINT_DIR + r"-([0-9]+)$")


class _Resume:
    """The snapshot a ``train()`` resumes from, and the directory standing in for it."""

    __slots__ = ("path", "stand_in", "state")

    def __init__(self, path: str, stand_in: str, state: dict[str, Any]) -> None:
        self.path = path
        self.stand_in = stand_in
        self.state = state


class _PrepareAfterFirstStep(TrainerCallback):
    """Prepares the staging buffers once the first optimizer step has made the optimizer's
    state (before the first save, which comes after this callback in the same step)."""

    def __init__(self, trainer: TsnapTrainer) -> None:
        self._trainer = trainer
        self._done = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._done:
            self._done = True
            self._trainer._tsnap_prepare()


class TsnapTrainer(Trainer):
    """A ``transformers.Trainer`` whose checkpoints are tsnap snapshots saved in the
    background; takes the Trainer's arguments, and:

    Arguments:
        tsnap_dtype: store floating weights and moments in this dtype (e.g.
            ``torch.bfloat16``); a resume is then not bit for bit. Default: as they are.
        tsnap_options: keywords of ``tsnap.Snapshotter`` (``max_in_flight`` default 2,
            ``staging_budget``, ``chunk_bytes``, ``io_threads``, ...).

    One Snapshotter per run directory, made after the first optimizer step, when the state is
    complete: its staging buffers are sized and faulted in then, so that the first save stalls
    no longer than the later ones; every save reuses them; ``close_checkpoints()`` frees them.
    """

    def __init__(self, *args: Any, tsnap_dtype: torch.dtype | None = None,
                 tsnap_options: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = dict(tsnap_options or {})
        options.setdefault("max_in_flight", 2)
        self._tsnap_dtype = tsnap_dtype
        self._tsnap = Saves(_PREFIX, options)
        self._tsnap_resume: _Resume | None = None
        self.add_callback(_PrepareAfterFirstStep(self))

    # -- public --------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any) -> Any:
        """``Trainer.train``; a tsnap snapshot to resume from (``True``: the newest committed
        ``checkpoint-<n>`` under ``output_dir``) is loaded whole, then handed to the Trainer's
        resume path. Waits for the saves in flight at the start and at the end (raising a
        failure). Raises tsnap.Error for a setup it does not cover."""
        self._check_supported()
        self._tsnap.wait()
        resume: Any = resume_from_checkpoint
        if isinstance(resume, bool) and resume:
            resume = self._last_checkpoint(os.fspath(self.args.output_dir or "."))
            if resume is None:
                raise ValueError(
                    f"No valid checkpoint found in output directory ({self.args.output_dir})")
        if resume is None or resume is False or not is_snapshot(os.fspath(resume)):
            return super().train(resume_from_checkpoint=resume or None, trial=trial,
                                 ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
        path = os.path.abspath(os.fspath(resume))
        record = metadata(path).get(RECORD_KEY)
        if not isinstance(record, dict) or record.get("format") != _RECORD_FORMAT:
            raise self._tsnap.error("unsupported_format",
                                    f"{path} is a tsnap snapshot, but not of a Trainer")
        state = load(path)
        # The Trainer reads trainer_state.json from the checkpoint's directory itself: it gets
        # a directory of its own holding only that, and the overrides below read the snapshot.
        stand_in = tempfile.mkdtemp(prefix="tsnap-resume-")
        try:
            with open(os.path.join(stand_in, _TRAINER_STATE_NAME), "w", encoding="utf-8") as f:
                f.write(json.dumps(state["trainer_state"], indent=2, sort_keys=True) + "\n")
            self._tsnap_resume = _Resume(path, stand_in, state)
            return super().train(resume_from_checkpoint=stand_in, trial=trial,
                                 ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
        finally:
            self._tsnap_resume = None
            shutil.rmtree(stand_in, ignore_errors=True)

    def wait_for_checkpoints(self) -> None:
        """Waits for every save in flight and the removals queued behind them; raises the
        first failure not raised yet (the others as warnings)."""
        self._tsnap.wait()

    def close_checkpoints(self) -> None:
        """``wait_for_checkpoints()``, then frees the staging buffers."""
        self._tsnap.close()

    @property
    def checkpoints_in_flight(self) -> list[str]:
        """The paths of the saves not known to be complete, oldest first."""
        return self._tsnap.in_flight

    # -- Trainer overrides: saving -------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        args = self.args
        folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        run_dir = os.path.abspath(self._get_output_dir(trial=trial))
        path = os.path.join(run_dir, folder)
        if (args.save_strategy in [SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST]
                and self.state.best_global_step):
            best = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.best_global_step}")
            if best == path or os.path.exists(best) or best in self._tsnap.in_flight:
                self.state.best_model_checkpoint = best
        snapshot = self._with_trainer_state(self._snapshot_state())
        meta = {"step": int(self.state.global_step), RECORD_KEY: {"format": _RECORD_FORMAT}}
        self._tsnap.ready()
        checked(snapshot, _PREFIX, path)
        self._tsnap.start(path, snapshot, meta, overwrite=True, dtype=self._tsnap_dtype)
        self._rotate(run_dir)

    def _tsnap_prepare(self) -> None:
        """Prepares the staging buffers of the run directory's saves for the state as it is."""
        if self.args.save_strategy == SaveStrategy.NO:
            return
        run_dir = os.path.abspath(self._get_output_dir(trial=None))
        self._tsnap.prepare(run_dir, self._snapshot_state(), dtype=self._tsnap_dtype)

    def _snapshot_state(self) -> dict[str, Any]:
        """The tensors' part of a checkpoint: model, optimizer, scheduler, scaler, RNG."""
        args = self.args
        unwrapped: Any = self.model
        optimizer: Any = self.optimizer
        snapshot: dict[str, Any] = {"model": unwrapped.state_dict()}
        if not args.save_only_model:
            snapshot["optimizer"] = optimizer.state_dict()
            if self.lr_scheduler is not None:
                snapshot["scheduler"] = self.lr_scheduler.state_dict()
            scaler = getattr(self.accelerator, "scaler", None)
            if scaler is not None:
                snapshot["scaler"] = scaler.state_dict()
            snapshot["rng"] = rng_state()
        return snapshot

    def _with_trainer_state(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """``snapshot`` with the trainer state, the stateful callbacks' states recorded in it
        first (as the Trainer's own save does, once per save)."""
        callback_states: Any = self.state.stateful_callbacks
        for cb in [c for c in self.callback_handler.callbacks + [self.control]
                   if isinstance(c, ExportableState)]:
            name = cb.__class__.__name__
            if isinstance(callback_states[name], list):
                callback_states[name].append(cb.state())
            else:
                callback_states[name] = cb.state()
        snapshot["trainer_state"] = dataclasses.asdict(self.state)
        return snapshot

    def _finalize_training(self, trial: Any, num_train_samples: Any, start_time: Any) -> Any:
        self._tsnap.wait()  # before the Trainer's own clean-up looks at the checkpoints
        return super()._finalize_training(trial, num_train_samples, start_time)

    # -- Trainer overrides: resuming -----------------------------------------------------------

    def _resumed(self, checkpoint: Any) -> dict[str, Any] | None:
        r = self._tsnap_resume
        if r is None or checkpoint is None or os.fspath(checkpoint) != r.stand_in:
            return None
        return r.state

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        state = self._resumed(resume_from_checkpoint)
        if state is None:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        target: Any = self.model if model is None else model
        result = target.load_state_dict(state["model"], strict=False)
        self._issue_warnings_after_load(result)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        state = self._resumed(checkpoint)
        if state is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        optimizer: Any = self.optimizer
        if "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state and self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(state["scheduler"])

    def _load_scaler(self, checkpoint: str | None) -> None:
        state = self._resumed(checkpoint)
        if state is None:
            return super()._load_scaler(checkpoint)
        scaler = getattr(self.accelerator, "scaler", None)
        if "scaler" in state and scaler is not None:
            scaler.load_state_dict(state["scaler"])

    def _load_rng_state(self, checkpoint: str | None) -> None:
        state = self._resumed(checkpoint)
        if state is None:
            return super()._load_rng_state(checkpoint)
        if "rng" in state:
            assert self._tsnap_resume is not None
            set_rng_state(state["rng"], _PREFIX, self._tsnap_resume.path)

    # -- internals -----------------------------------------------------------------------------

    def _check_supported(self) -> None:
        args = self.args
        why = None
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            why = "DeepSpeed and FSDP write their own checkpoints"
        elif args.world_size > 1:
            why = f"{args.world_size} processes: TsnapTrainer saves from a single process"
        elif args.load_best_model_at_end:
            why = "load_best_model_at_end reads the best checkpoint's files itself"
        elif args.push_to_hub:
            why = "push_to_hub uploads the checkpoint's files"
        if why is not None:
            raise self._tsnap.error("unsupported", f"not supported: {why}")

    def _last_checkpoint(self, run_dir: str) -> str | None:
        """The newest ``checkpoint-<n>`` that is committed (a snapshot, or a directory the
        plain Trainer wrote, with its trainer_state.json)."""
        found = [(n, p) for n, p in self._numbered(os.path.abspath(run_dir), False)
                 if is_snapshot(p) or os.path.isfile(os.path.join(p, _TRAINER_STATE_NAME))]
        return max(found)[1] if found else None

    def _numbered(self, run_dir: str, include_in_flight: bool) -> list[tuple[int, str]]:
        found = self._tsnap.numbered(run_dir, _NAME, include_in_flight)
        return sorted((n, p) for p, n in found.items())

    def _rotate(self, run_dir: str) -> None:
        """``save_total_limit``: the oldest checkpoints beyond it are removed (queued until the
        saves in flight commit); the newest and the best are kept."""
        limit = self.args.save_total_limit
        if limit is None or limit <= 0:
            return
        checkpoints = [p for _, p in self._numbered(run_dir, True)]
        protected = {checkpoints[-1]} if checkpoints else set()
        if self.state.best_model_checkpoint is not None:
            protected.add(os.path.abspath(self.state.best_model_checkpoint))
        keep = max(limit, len(protected))
        remaining = len(checkpoints)
        for path in checkpoints:
            if remaining <= keep:
                break
            if path not in protected:
                self._tsnap.remove(path)
                remaining -= 1
