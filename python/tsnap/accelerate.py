"""Hugging Face ``accelerate`` checkpoints as tsnap snapshots: ``save_state`` and ``load_state``
in place of ``Accelerator.save_state`` / ``Accelerator.load_state``::

    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration
    import tsnap.accelerate

    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir="runs/exp1", automatic_checkpoint_naming=True, total_limit=3))
    model, optimizer, train_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, sched)
    ...
    tsnap.accelerate.save_state(accelerator)     # was: accelerator.save_state()
    ...
    tsnap.accelerate.load_state(accelerator)     # was: accelerator.load_state()
    tsnap.accelerate.wait(accelerator)           # before exit: raises a failed save's error

What ``Accelerator.save_state`` writes as a dozen files becomes one snapshot directory at the
same path (``runs/exp1/checkpoints/checkpoint_3/``, or ``output_dir``), committed atomically:
the prepared models' state dicts, the optimizers', the LR schedulers', the dataloaders' epoch
counters and sampler seeds (and ``StatefulDataLoader`` states), the GradScaler's, the RNG states
(Python, NumPy, torch CPU and CUDA), ``accelerator.step`` and the objects given to
``register_for_checkpointing``. Tensors go into safetensors shards, everything else into the
manifest; nothing is pickled, and a value a snapshot cannot hold is a tsnap.InvalidArgument
naming its key before anything is written.

``save_state`` returns once the tensors are staged; the write and the commit run in the
background. ``wait`` (or the next ``save_state``/``load_state``) raises a failure.
``total_limit`` retention never removes a snapshot while a save is in flight: removals wait for
the saves started before them to commit, and are dropped if one fails.

Single process only (``accelerator.num_processes == 1``); FSDP, DeepSpeed, Megatron-LM and XLA
are refused, as are registered save/load-state pre-hooks.
"""

from __future__ import annotations

import os
import re
import weakref
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.data_loader import SeedableRandomSampler, get_sampler

from ._api import PathArg, load, metadata
from ._integration import Saves, checked, is_snapshot, rng_state, set_rng_state

__all__ = ["RECORD_KEY", "Checkpointer", "checkpointer", "load_state", "save_state", "wait"]

RECORD_KEY = "tsnap_accelerate"
_RECORD_FORMAT = 1
_PREFIX = "tsnap.accelerate"
_NAME = re.compile(r"^checkpoint_([0-9]+)$")
_UNSUPPORTED = ("FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA")


class Checkpointer:
    """Saves and loads an ``Accelerator``'s state as tsnap snapshots.

    ``tsnap.accelerate.save_state(accelerator)`` uses the one of ``checkpointer(accelerator)``;
    make one yourself to pass options.

    Arguments:
        accelerator: the ``Accelerator`` whose prepared objects are saved.
        dtype: store floating weights and moments in this dtype (e.g. ``torch.bfloat16``); a
            resume is then not bit for bit. Default: as they are.
        max_in_flight: saves writing at once; one more waits in ``save_state`` for a slot.
        staging_budget: bytes of staging buffers (0: sized at the first save).
        snapshotter_options: other keywords of ``tsnap.Snapshotter``.

    Thread-safety: call it from the training thread. Each directory that snapshots are saved
    in gets its own Snapshotter (staging buffers reused by every save there); ``close()``
    waits for every save and frees them. Made before the first optimizer step (right after
    ``accelerator.prepare(...)``) with ``automatic_checkpoint_naming`` on, it sizes and faults
    in the staging buffers after that step, once the optimizers' state exists, so that the
    first save stalls no longer than the later ones.
    """

    def __init__(self, accelerator: Accelerator, *, dtype: torch.dtype | None = None,
                 max_in_flight: int = 2, staging_budget: int = 0,
                 **snapshotter_options: Any) -> None:
        self.accelerator = accelerator
        self._dtype = dtype
        self._saves = Saves(_PREFIX, dict(snapshotter_options, max_in_flight=int(max_in_flight),
                                          staging_budget=int(staging_budget)))
        self._prepare_hooks: list[Any] = []
        if accelerator.project_configuration.automatic_checkpoint_naming:
            for o in accelerator._optimizers:
                inner = getattr(o, "optimizer", o)
                self._prepare_hooks.append(inner.register_step_post_hook(self._after_step))

    def _after_step(self, *_: Any) -> None:
        """After the first optimizer step: prepares the staging buffers of the saves into the
        checkpoints directory for the state as it is now."""
        hooks, self._prepare_hooks = self._prepare_hooks, []
        for h in hooks:
            h.remove()
        acc = self.accelerator
        state = {"models": [acc.get_state_dict(m, unwrap=False) for m in acc._models],
                 "optimizers": [o.state_dict() for o in acc._optimizers],
                 "scaler": None if acc.scaler is None else acc.scaler.state_dict(),
                 "rng": rng_state()}
        self._saves.prepare(self._checkpoints_dir(), state, dtype=self._dtype)

    def save_state(self, output_dir: PathArg | None = None) -> str:
        """Starts saving the accelerator's state and returns the snapshot's path once the
        tensors are staged.

        With ``automatic_checkpoint_naming`` the snapshot is
        ``<project_dir>/checkpoints/checkpoint_<iteration>`` (``output_dir`` is ignored, as by
        accelerate), the iteration is advanced and the oldest snapshots beyond ``total_limit``
        are removed once the saves in flight have committed. Otherwise it is ``output_dir``,
        replaced atomically when one is there. Raises tsnap.InvalidArgument for a value that
        cannot be saved (named by its key), tsnap.Error for an unsupported setup, an existing
        ``checkpoint_<iteration>``, or the failure of an earlier save.
        """
        acc = self.accelerator
        self._check_supported("save")
        automatic = bool(acc.project_configuration.automatic_checkpoint_naming)
        iteration = int(acc.save_iteration)
        if automatic:
            root = self._checkpoints_dir()
            path = os.path.join(root, f"checkpoint_{iteration}")
            if os.path.lexists(path) or path in self._saves.in_flight:
                raise self._saves.error(
                    "already_exists", f"{path} already exists: set "
                    "accelerator.project_configuration.iteration to the iteration to save next")
        elif output_dir is None:
            raise self._saves.error("invalid_argument", "save_state needs an output_dir "
                                    "unless automatic_checkpoint_naming is on")
        else:
            path = _abspath(output_dir)
        state = {
            "models": [acc.get_state_dict(m, unwrap=False) for m in acc._models],
            "optimizers": [o.state_dict() for o in acc._optimizers],
            "schedulers": [s.state_dict() for s in acc._schedulers],
            "dataloaders": [_dataloader_state(d) for d in acc._dataloaders],
            "scaler": None if acc.scaler is None else acc.scaler.state_dict(),
            "rng": rng_state(),
            "step": int(acc.step),
            "custom": [o.state_dict() for o in acc._custom_objects],
        }
        record = {"format": _RECORD_FORMAT, "iteration": iteration}
        self._saves.ready()
        checked(state, _PREFIX, path)
        self._saves.start(path, state, {RECORD_KEY: record}, overwrite=not automatic,
                          dtype=self._dtype)
        acc.project_configuration.iteration = iteration + 1
        limit = acc.project_configuration.total_limit
        if automatic and limit is not None and limit > 0:
            for old in self._numbered(include_in_flight=True)[:-limit]:
                self._saves.remove(old)
        return path

    def load_state(self, input_dir: PathArg | None = None) -> str:
        """Loads a snapshot into the accelerator's prepared objects, the RNGs,
        ``accelerator.step`` and the registered objects; returns its path.

        Waits for the saves in flight first (raising a failure). ``input_dir`` None, with
        ``automatic_checkpoint_naming``: the newest committed ``checkpoint_<n>``, and the
        iteration is set to n + 1 so that the next save follows it. Raises tsnap.IoError
        when there is nothing to load, tsnap.FormatError when ``input_dir`` is not a tsnap
        snapshot of an accelerator, tsnap.InvalidArgument when it holds a different number of
        models, optimizers, schedulers, dataloaders or registered objects than are prepared.
        """
        acc = self.accelerator
        self._check_supported("load")
        self._saves.wait()
        if input_dir is not None:
            path = _abspath(input_dir)
            if not os.path.lexists(path):
                raise self._saves.error("not_found", f"nothing to load at {path}")
        elif acc.project_configuration.automatic_checkpoint_naming:
            found = self._numbered(include_in_flight=False)
            if not found:
                raise self._saves.error("not_found", "no committed checkpoint_<n> under "
                                        f"{self._checkpoints_dir()}")
            path = found[-1]
        else:
            raise self._saves.error("invalid_argument", "load_state needs an input_dir "
                                    "unless automatic_checkpoint_naming is on")
        if not is_snapshot(path):
            raise self._saves.error("unsupported_format", f"{path} is not a tsnap snapshot "
                                    "(a directory written by Accelerator.save_state loads with "
                                    "accelerator.load_state)")
        record = metadata(path).get(RECORD_KEY)
        if not isinstance(record, dict) or record.get("format") != _RECORD_FORMAT:
            raise self._saves.error("unsupported_format",
                                    f"{path} is a tsnap snapshot, but not of an accelerator")
        state = load(path)
        groups = {"models": acc._models, "optimizers": acc._optimizers,
                  "schedulers": acc._schedulers, "dataloaders": acc._dataloaders,
                  "custom": acc._custom_objects}
        for key, objects in groups.items():
            saved = state.get(key)
            if not isinstance(saved, list) or len(saved) != len(objects):
                count = len(saved) if isinstance(saved, list) else 0
                raise self._saves.error(
                    "invalid_argument", f"{path} holds {count} {key}, the accelerator has "
                    f"{len(objects)}: prepare (or register) the same objects as the saving run")
        for model, sd in zip(acc._models, state["models"]):
            model.load_state_dict(sd)
        for opt, sd in zip(acc._optimizers, state["optimizers"]):
            opt.load_state_dict(sd)
        for sched, sd in zip(acc._schedulers, state["schedulers"]):
            sched.load_state_dict(sd)
        for dl, sd in zip(acc._dataloaders, state["dataloaders"]):
            _load_dataloader_state(dl, sd)
        if acc.scaler is not None and state.get("scaler") is not None:
            acc.scaler.load_state_dict(state["scaler"])
        for obj, sd in zip(acc._custom_objects, state["custom"]):
            obj.load_state_dict(sd)
        acc.step = int(state["step"])
        set_rng_state(state["rng"], _PREFIX, path)
        if input_dir is None:
            acc.project_configuration.iteration = int(record["iteration"]) + 1
        return path

    def wait(self) -> None:
        """Waits for every save in flight and the removals queued behind them; raises the
        first failure not raised yet (the others as warnings)."""
        self._saves.wait()

    def close(self) -> None:
        """``wait()``, then frees the staging buffers (a later save makes new ones)."""
        self._saves.close()

    @property
    def in_flight(self) -> list[str]:
        """The paths of the saves not known to be complete, oldest first."""
        return self._saves.in_flight

    def _check_supported(self, what: str) -> None:
        acc = self.accelerator
        kind = str(getattr(acc.distributed_type, "value", acc.distributed_type))
        if kind in _UNSUPPORTED or acc.num_processes != 1:
            raise self._saves.error(
                "unsupported", f"cannot {what} with {kind} and {acc.num_processes} "
                "process(es): tsnap.accelerate handles a single process (use "
                "tsnap.PeriodicSnapshots with a tsnap.DistGroup across ranks)")
        hooks = acc._save_model_state_pre_hook if what == "save" else \
            acc._load_model_state_pre_hook
        if hooks:
            raise self._saves.error(
                "unsupported", f"{len(hooks)} {what}-state pre-hook(s) are registered: they "
                "write and read files of their own, which a snapshot does not hold")

    def _checkpoints_dir(self) -> str:
        return os.path.join(_abspath(self.accelerator.project_dir), "checkpoints")

    def _numbered(self, include_in_flight: bool) -> list[str]:
        """The ``checkpoint_<n>`` snapshots (committed, and in flight if asked), by n."""
        found = self._saves.numbered(self._checkpoints_dir(), _NAME, include_in_flight)
        return sorted((p for p in found if include_in_flight or is_snapshot(p)),
                      key=found.__getitem__)


_checkpointers: weakref.WeakKeyDictionary[Accelerator, Checkpointer] = \
    weakref.WeakKeyDictionary()


def checkpointer(accelerator: Accelerator) -> Checkpointer:
    """The ``Checkpointer`` of ``accelerator`` that the functions of this module use (made at
    the first call, with the default options)."""
    found = _checkpointers.get(accelerator)
    if found is None:
        found = _checkpointers[accelerator] = Checkpointer(accelerator)
    return found


def save_state(accelerator: Accelerator, output_dir: PathArg | None = None) -> str:
    """``accelerator.save_state(output_dir)`` as a tsnap snapshot, in the background
    (``Checkpointer.save_state``)."""
    return checkpointer(accelerator).save_state(output_dir)


def load_state(accelerator: Accelerator, input_dir: PathArg | None = None) -> str:
    """``accelerator.load_state(input_dir)`` from a tsnap snapshot
    (``Checkpointer.load_state``)."""
    return checkpointer(accelerator).load_state(input_dir)


def wait(accelerator: Accelerator) -> None:
    """Waits for the saves of ``accelerator`` in flight; raises the first failure."""
    checkpointer(accelerator).wait()


def _abspath(path: PathArg) -> str:
    return os.path.abspath(os.path.expanduser(os.fsdecode(os.fspath(path))))


def _dataloader_state(dataloader: Any) -> dict[str, Any]:
    """What a resume needs of a prepared dataloader: its epoch counter, a seedable sampler's
    seed and epoch, and a stateful dataloader's state."""
    out: dict[str, Any] = {}
    if isinstance(getattr(dataloader, "iteration", None), int):
        out["iteration"] = dataloader.iteration
    sampler = get_sampler(dataloader)
    if isinstance(sampler, SeedableRandomSampler):
        out["sampler"] = {"epoch": int(sampler.epoch), "initial_seed": int(sampler.initial_seed)}
    if getattr(dataloader, "use_stateful_dataloader", False):
        out["state"] = dataloader.state_dict()
    return out


def _load_dataloader_state(dataloader: Any, state: dict[str, Any]) -> None:
    if "iteration" in state and hasattr(dataloader, "iteration"):
        dataloader.iteration = int(state["iteration"])
    sampler = get_sampler(dataloader)
    if "sampler" in state and isinstance(sampler, SeedableRandomSampler):
        sampler.epoch = int(state["sampler"]["epoch"])
        sampler.initial_seed = int(state["sampler"]["initial_seed"])
    if "state" in state and getattr(dataloader, "use_stateful_dataloader", False):
        dataloader.load_state_dict(state["state"])
