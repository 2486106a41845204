"""Periodic snapshots for Python training loops, backed by tsnap's C++ hook."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterable, Mapping
from types import FrameType
from typing import Any, Callable, Literal, Optional, Union

import torch

from . import _C, _api, _dist
from ._api import (
    DtypeRules,
    PathArg,
    Snapshotter,
    Staging,
    _dtype_arg,
    _saved_metadata,
    _user_metadata,
    load_into,
    metadata,
)
from ._errors import error
from ._tree import TREE_KEY, State, Tensors, unflatten

# The C++ WhenBusy: kSkip, kWait.
WhenBusy = Literal["skip", "wait"]
# Metadata of each snapshot: a dict, or a callable called at each save.
Metadata = Optional[Union[Mapping[str, Any], Callable[[], Optional[Mapping[str, Any]]]]]


class PeriodicSnapshots:
    """Takes snapshots of ``make_state()`` every N steps, every T seconds and on signals.

    ::

        snap = tsnap.Snapshotter("runs/exp1")
        hook = tsnap.PeriodicSnapshots(
            snap, lambda: {"model": model.state_dict(), "optim": opt.state_dict()},
            every_steps=500, every_seconds=600, on_signals=[signal.SIGTERM], keep_last=3)
        step = hook.resume(lambda s: (model.load_state_dict(s["model"]),
                                      opt.load_state_dict(s["optim"])))  # 0 when nothing
        while step < total:
            train_step()
            step += 1
            hook.after_step(step)      # saves when due: blocks for the staging copy only
            if hook.stop_requested:    # a signal came: the final snapshot is committed
                break
        hook.finish()                  # waits for the save in flight; raises its error

    Snapshots are named ``step-%08d`` under the Snapshotter's root, with ``{"step": step}``
    added to their metadata. ``keep_last`` / ``keep_every_steps``: retention after each commit.
    ``when_busy`` (``WhenBusy``): 'skip' a snapshot that is due while the previous one is
    writing, or 'wait'.
    ``staging='lazy'``: call ``before_optimizer_step()`` before the tensors next change.
    ``log``: one line per event on stderr (False: none). Save and keep policies as in the
    C++ ``ScheduleOptions``: ``at_steps``, ``continuous`` (+ ``min_interval_seconds``),
    ``max_overhead`` (adaptive), ``keep_every_seconds``, ``keep_best`` by the number
    ``best_metric`` of each snapshot's metadata (``best_mode`` 'min' or 'max',
    ``keep_without_metric``); give ``metadata`` as a callable to report the metric at each save,
    e.g. ``metadata=lambda: {"val_loss": last_val_loss}``. Each snapshot records its step and
    the tensors identical to the previous snapshot; with ``stale_check`` (the default) a
    snapshot whose optimizer moments (``must_change`` globs, default ``*/exp_avg``,
    ``*/exp_avg_sq``, ``*/momentum_buffer``, ``*/square_avg``) did not change while the step
    advanced is logged as a warning and listed in its record's ``save.stale``
    (``fail_if_stale``: the save fails instead). The C++ hook owns the timer, the
    signal handlers (the previous ones are restored by ``close()``) and retention; every save
    starts on the training thread inside ``after_step`` (the only place ``make_state`` runs).
    The Snapshotter must stay open while the hook lives. ``agent`` (with a root) makes the
    hook's Snapshotter hand its saves to a ``tsnap agent`` (see ``Snapshotter``): snapshots
    outlive a killed process, and ``resume`` reads the newest from the agent's memory.

    Across ranks: ``PeriodicSnapshots(root, make_state, group=tsnap.DistGroup(), ...)`` (or a
    Snapshotter made with the group) on every rank, with the same schedule and the same steps
    reported. Step-based snapshots are taken by every rank at the same steps; a time-based one
    (rank 0's clock) or a signal on any rank is posted to the group for a step a little ahead,
    which every rank takes, so a SIGTERM to one rank stops every rank after the same final
    snapshot. ``make_state`` may return DTensors (``get_state_dict(model, optimizer)``); resume
    them with ``resume(apply, into=...)``, which reads only each rank's region.
    """

    def __init__(self, snapshotter: Snapshotter | PathArg, make_state: Callable[[], State], *,
                 every_steps: int = 0, every_seconds: float = 0.0,
                 on_signals: Iterable[int] = (), keep_last: int = 0, keep_every_steps: int = 0,
                 dtype: torch.dtype | None = None, staging: Staging = "eager",
                 when_busy: WhenBusy = "skip", metadata: Metadata = None, log: bool = True,
                 at_steps: Iterable[int] = (), continuous: bool = False,
                 min_interval_seconds: float = 0.0, max_overhead: float = 0.0,
                 keep_every_seconds: float = 0.0, keep_best: int = 0, best_metric: str = "",
                 best_mode: Literal["min", "max"] = "min", keep_without_metric: bool = True,
                 dtype_rules: DtypeRules = None, group: _dist.DistGroup | None = None,
                 stale_check: bool = True, must_change: Iterable[str] | None = None,
                 fail_if_stale: bool = False, agent: PathArg | None = None) -> None:
        if when_busy not in ("skip", "wait"):
            raise error("invalid_argument",
                        f"tsnap: when_busy must be 'skip' or 'wait', not {when_busy!r}")
        self._own_snapshotter: Snapshotter | None = None
        if not isinstance(snapshotter, Snapshotter):
            # A root: the hook makes (and closes) its own Snapshotter, with the group and agent.
            snapshotter = self._own_snapshotter = Snapshotter(snapshotter, group=group,
                                                              agent=agent)
        elif agent is not None:
            raise error("invalid_argument",
                        "tsnap: PeriodicSnapshots' agent is its Snapshotter's (make the "
                        "Snapshotter with agent=..., or give the hook a root instead)")
        elif group is not None and group is not snapshotter.group:
            raise error(
                "invalid_argument",
                "tsnap: PeriodicSnapshots' group must be its Snapshotter's (make the "
                "Snapshotter with group=..., or give the hook a root instead)")
        self.snapshotter = snapshotter
        self._make_state = make_state
        self._metadata = metadata

        def make() -> tuple[Tensors, str, _dist.Shards]:
            # A callable metadata is called at each save (e.g. for keep_best's metric).
            meta = self._metadata() if callable(self._metadata) else self._metadata
            tensors, meta_text = _saved_metadata(self._make_state(), meta)
            tensors, shards = _dist.to_pieces(tensors, snapshotter.group)
            return tensors, meta_text, shards

        policies: dict[str, Any] = {
            "at_steps": [int(s) for s in at_steps], "continuous": bool(continuous),
            "min_interval_seconds": float(min_interval_seconds),
            "max_overhead": float(max_overhead), "keep_every_seconds": float(keep_every_seconds),
            "keep_best": int(keep_best), "best_metric": str(best_metric),
            "best_mode": str(best_mode), "keep_without_metric": bool(keep_without_metric),
            "stale_check": bool(stale_check),
            "must_change": [str(p) for p in (must_change or ())],
            "fail_if_stale": bool(fail_if_stale)}
        # SIGINT among on_signals: Ctrl-C takes a final snapshot at the end of the step, then
        # after_step raises KeyboardInterrupt (Python's own handler would raise it mid-step,
        # before any snapshot); a second Ctrl-C raises at once.
        self._interrupts = 0
        self._prev_sigint: Any = None
        self.resumed_metadata: dict[str, Any]  # set by resume()
        if (int(signal.SIGINT) in [int(s) for s in on_signals]
                and threading.current_thread() is threading.main_thread()):
            self._prev_sigint = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            self._h = _C.PeriodicSnapshots(
                snapshotter=snapshotter._s, make_state=make, every_steps=int(every_steps),
                every_seconds=float(every_seconds), on_signals=[int(s) for s in on_signals],
                keep_last=int(keep_last), keep_every_steps=int(keep_every_steps),
                dtype=_dtype_arg(dtype, dtype_rules), staging=staging,
                wait_when_busy=when_busy == "wait", log=bool(log), **policies)
        except BaseException:
            if self._prev_sigint is not None:
                signal.signal(signal.SIGINT, self._prev_sigint)
            raise
        _api._open_hooks.add(self)

    def resume(self, apply: Callable[[State], object],
               into: State | Callable[[], State] | None = None) -> int:
        """Loads the newest valid snapshot (by step; corrupt ones are skipped), calls
        ``apply(state)`` with it (the structure ``make_state`` returned) and returns its step;
        returns 0 without calling ``apply`` when there is none.

        ``into`` (a state, or a callable returning one, e.g. ``lambda: {"app":
        get_state_dict(model, opt)}``) loads the newest snapshot in place into its tensors
        (``tsnap.load_into``: DTensors get their own region, whatever mesh saved it) and
        calls ``apply`` with that state; a snapshot that fails to load raises its error.
        """
        if into is not None:
            path = self.snapshotter.latest()
            if path is None:
                return 0
            state = into() if callable(into) else into
            load_into(path, state)
            self.resumed_metadata = metadata(path)
            apply(state)
            return int(self.resumed_metadata.get("step", 0))

        def on_checkpoint(tensors: Tensors, meta_text: str) -> None:
            meta = json.loads(meta_text)
            state = unflatten(meta[TREE_KEY], tensors) if TREE_KEY in meta else tensors
            self.resumed_metadata = _user_metadata(meta)
            apply(state)

        return self._h.resume(on_checkpoint)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self._interrupts += 1
        if self._interrupts > 1:
            raise KeyboardInterrupt  # a second Ctrl-C: at once

    def after_step(self, step: int) -> None:
        """Reports that ``step`` steps are complete; saves when one is due.

        With SIGINT among ``on_signals``, a Ctrl-C is turned into a final snapshot here, and
        then raises KeyboardInterrupt, as Ctrl-C would have, once that snapshot is committed."""
        self._h.after_step(int(step))
        if self._interrupts and self._h.stop_signal == int(signal.SIGINT):
            self._interrupts = 0
            raise KeyboardInterrupt("tsnap: SIGINT: the final snapshot was taken first")

    def before_optimizer_step(self) -> None:
        """Lazy staging: waits until the last snapshot is staged."""
        self._h.before_optimizer_step()

    @property
    def stop_requested(self) -> bool:
        """True once a signal came and its final snapshot committed (or failed)."""
        return self._h.stop_requested

    @property
    def stop_signal(self) -> int:
        """The signal that stopped training, 0 while none has."""
        return self._h.stop_signal

    def finish(self) -> _C.PeriodicStats:
        """Waits for the save in flight; returns the stats (snapshots, skipped, failed,
        stall_s, bytes); raises the first background save error not raised yet."""
        return self._h.finish()

    def stats(self) -> _C.PeriodicStats:
        """The figures so far (complete for every snapshot that has finished)."""
        return self._h.stats()

    def close(self) -> None:
        """Waits for the save in flight, stops the hook's thread, restores signal handlers
        (and closes the Snapshotter the hook made, if given a root)."""
        self._h.close()
        if self._prev_sigint is not None:
            signal.signal(signal.SIGINT, self._prev_sigint)
            self._prev_sigint = None
        if self._own_snapshotter is not None:
            self._own_snapshotter.close()

    def __enter__(self) -> PeriodicSnapshots:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
