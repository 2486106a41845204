"""Periodic snapshots for Python training loops, backed by tsnap's C++ hook."""

import json
import signal
import threading

from . import _C
from . import _dist
from ._api import Snapshotter, _dtype_arg, _saved_metadata, _user_metadata, load_into, metadata
from ._tree import TREE_KEY, unflatten


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
    ``when_busy``: 'skip' a snapshot that is due while the previous one is writing, or 'wait'.
    ``staging='lazy'``: call ``before_optimizer_step()`` before the tensors next change.
    ``log``: one line per event on stderr (False: none). Save and keep policies as in the
    C++ ``ScheduleOptions``: ``at_steps``, ``continuous`` (+ ``min_interval_seconds``),
    ``max_overhead`` (adaptive), ``keep_every_seconds``, ``keep_best`` by the number
    ``best_metric`` of each snapshot's metadata (``best_mode`` 'min' or 'max',
    ``keep_without_metric``); give ``metadata`` as a callable to report the metric at each save,
    e.g. ``metadata=lambda: {"val_loss": last_val_loss}``. The C++ hook owns the timer, the
    signal handlers (the previous ones are restored by ``close()``) and retention; every save
    starts on the training thread inside ``after_step`` (the only place ``make_state`` runs).
    The Snapshotter must stay open while the hook lives.

    Across ranks: ``PeriodicSnapshots(root, make_state, group=tsnap.DistGroup(), ...)`` (or a
    Snapshotter made with the group) on every rank, with the same schedule and the same steps
    reported. Step-based snapshots are taken by every rank at the same steps; a time-based one
    (rank 0's clock) or a signal on any rank is posted to the group for a step a little ahead,
    which every rank takes, so a SIGTERM to one rank stops every rank after the same final
    snapshot. ``make_state`` may return DTensors (``get_state_dict(model, optimizer)``); resume
    them with ``resume(apply, into=...)``, which reads only each rank's region.
    """

    def __init__(self, snapshotter, make_state, *, every_steps=0, every_seconds=0.0,
                 on_signals=(), keep_last=0, keep_every_steps=0, dtype=None, staging="eager",
                 when_busy="skip", metadata=None, log=True, at_steps=(), continuous=False,
                 min_interval_seconds=0.0, max_overhead=0.0, keep_every_seconds=0.0,
                 keep_best=0, best_metric="", best_mode="min", keep_without_metric=True,
                 dtype_rules=None, group=None):
        if when_busy not in ("skip", "wait"):
            raise ValueError(f"tsnap: when_busy must be 'skip' or 'wait', not {when_busy!r}")
        self._own_snapshotter = None
        if not isinstance(snapshotter, Snapshotter):
            # A root: the hook makes (and closes) its own Snapshotter, with the group.
            snapshotter = self._own_snapshotter = Snapshotter(snapshotter, group=group)
        elif group is not None and group is not snapshotter.group:
            raise _C.InvalidArgument(
                "tsnap: PeriodicSnapshots' group must be its Snapshotter's (make the "
                "Snapshotter with group=..., or give the hook a root instead)")
        self.snapshotter = snapshotter
        self._make_state = make_state
        self._metadata = metadata

        def make():
            # A callable metadata is called at each save (e.g. for keep_best's metric).
            meta = self._metadata() if callable(self._metadata) else self._metadata
            tensors, meta_text = _saved_metadata(self._make_state(), meta)
            tensors, shards = _dist.to_pieces(tensors, snapshotter.group)
            return tensors, meta_text, shards

        policies = {
            "at_steps": [int(s) for s in at_steps], "continuous": bool(continuous),
            "min_interval_seconds": float(min_interval_seconds),
            "max_overhead": float(max_overhead), "keep_every_seconds": float(keep_every_seconds),
            "keep_best": int(keep_best), "best_metric": str(best_metric),
            "best_mode": str(best_mode), "keep_without_metric": bool(keep_without_metric)}
        # SIGINT among on_signals: Ctrl-C takes a final snapshot at the end of the step, then
        # after_step raises KeyboardInterrupt (Python's own handler would raise it mid-step,
        # before any snapshot); a second Ctrl-C raises at once.
        self._interrupts = 0
        self._prev_sigint = None
        if (int(signal.SIGINT) in [int(s) for s in on_signals]
                and threading.current_thread() is threading.main_thread()):
            self._prev_sigint = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            self._h = _C.PeriodicSnapshots(
                snapshotter._s, make, int(every_steps), float(every_seconds),
                [int(s) for s in on_signals], int(keep_last), int(keep_every_steps),
                _dtype_arg(dtype, dtype_rules), staging,
                when_busy == "wait", bool(log), json.dumps(policies))
        except BaseException:
            if self._prev_sigint is not None:
                signal.signal(signal.SIGINT, self._prev_sigint)
            raise

    def resume(self, apply, into=None):
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

        def on_checkpoint(tensors, meta_text):
            meta = json.loads(meta_text)
            state = unflatten(meta[TREE_KEY], tensors) if TREE_KEY in meta else tensors
            self.resumed_metadata = _user_metadata(meta)
            apply(state)

        return self._h.resume(on_checkpoint)

    def _on_sigint(self, signum, frame):
        self._interrupts += 1
        if self._interrupts > 1:
            raise KeyboardInterrupt  # a second Ctrl-C: at once

    def after_step(self, step):
        """Reports that ``step`` steps are complete; saves when one is due.

        With SIGINT among ``on_signals``, a Ctrl-C is turned into a final snapshot here, and
        then raises KeyboardInterrupt, as Ctrl-C would have, once that snapshot is committed."""
        self._h.after_step(int(step))
        if self._interrupts and self._h.stop_signal == int(signal.SIGINT):
            self._interrupts = 0
            raise KeyboardInterrupt("tsnap: SIGINT: the final snapshot was taken first")

    def before_optimizer_step(self):
        """Lazy staging: waits until the last snapshot is staged."""
        self._h.before_optimizer_step()

    @property
    def stop_requested(self):
        """True once a signal came and its final snapshot committed (or failed)."""
        return self._h.stop_requested

    @property
    def stop_signal(self):
        """The signal that stopped training, 0 while none has."""
        return self._h.stop_signal

    def finish(self):
        """Waits for the save in flight; returns the stats (snapshots, skipped, failed,
        stall_s, bytes); raises the first background save error not raised yet."""
        return self._h.finish()

    def stats(self):
        return self._h.stats()

    def close(self):
        """Waits for the save in flight, stops the hook's thread, restores signal handlers
        (and closes the Snapshotter the hook made, if given a root)."""
        self._h.close()
        if self._prev_sigint is not None:
            signal.signal(signal.SIGINT, self._prev_sigint)
            self._prev_sigint = None
        if self._own_snapshotter is not None:
            self._own_snapshotter.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
