"""Lightning checkpoints as tsnap snapshots: ``TsnapCheckpointIO``, a ``CheckpointIO`` plugin for
``lightning.pytorch.Trainer`` and ``lightning.fabric.Fabric`` (the ``lightning`` package, 2.x)::

    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from tsnap.lightning import TsnapCheckpointIO

    trainer = Trainer(plugins=[TsnapCheckpointIO()],
                      callbacks=[ModelCheckpoint(dirpath="ckpt", save_last=True,
                                                 every_n_train_steps=500)])
    trainer.fit(model, ckpt_path="last")      # resumes from ckpt/last.ckpt when there is one

    fabric = Fabric(plugins=[TsnapCheckpointIO()])
    fabric.save("ckpt/step-100.ckpt", {"model": model, "optimizer": opt, "step": 100})
    fabric.load("ckpt/step-100.ckpt", state)

Each checkpoint is a tsnap snapshot: a *directory* at the path Lightning names
(``ckpt/epoch=0-step=500.ckpt/``) holding safetensors shards and a ``MANIFEST.json``, committed
atomically (an overwrite replaces the old snapshot in one rename), so ``tsnap verify``,
``tsnap.load`` and ``tsnap.latest`` work on it. The checkpoint dict's tensors (model weights,
optimizer moments, scores) go into the shards; everything else (epoch, global step, the loops'
progress, callbacks' state, hyper-parameters, LR schedulers, the precision plugin's scaler)
into the manifest as tsnap's validated structure record (dicts with str or int keys, lists,
tuples, int, float, bool, str, None, torch dtypes), and the values hyper-parameters often hold
beyond those (``argparse.Namespace``, ``pathlib`` paths, numpy scalars and small arrays, sets,
bytes, ``Counter``, ``defaultdict``, enum members, classes, omegaconf containers) as plain
values plus a tag in the plugin's record, restored with their type by a load: nothing is
pickled, and a load imports no class a checkpoint names unless ``import_types`` allows it. A
value outside that set is a ``tsnap.InvalidArgument`` naming its key
(``hyper_parameters/config``) before anything is written.

``save_checkpoint`` returns once the tensors are staged (copied into tsnap's buffers); the write
and the commit run in the background. Lightning's next calls see a consistent picture:
``load_checkpoint`` of a path being written waits for it; ``remove_checkpoint`` never removes a
snapshot while saves of this plugin are in flight (the removal is queued until they commit, and
dropped, keeping the snapshot, if one of them fails), so the newest committed checkpoint
survives a save that fails; ``teardown()`` (Lightning calls it at the end of ``fit``,
``validate``, ``test``) waits for every save and raises the first failure. A failure is also
raised by the next ``save_checkpoint``; at interpreter exit (Fabric never calls ``teardown``)
the saves in flight are waited for and a failure is printed on stderr. A second save of the
same step and tensors into the same directory (``last.ckpt`` after a top-k checkpoint) waits
for the first and hard-links its files.

``load(path)`` returns a checkpoint dict and ``load_from_checkpoint(ModelClass, path)`` builds
a module from one: ``LightningModule.load_from_checkpoint`` and ``lightning.pytorch.core.saving``
read files with ``torch.load`` themselves, not through the plugin, and cannot read a snapshot.
Sharded strategies write their checkpoints themselves, not through a ``CheckpointIO``:
``TsnapModelParallelStrategy`` is Lightning's ``ModelParallelStrategy`` (FSDP2, tensor
parallelism) saving each rank's shards into one snapshot, restorable on any world size::

    trainer = Trainer(strategy=TsnapModelParallelStrategy(), callbacks=[ModelCheckpoint(...)])

Not covered: ``FSDPStrategy`` (FSDP1) and DeepSpeed; the standalone ``pytorch_lightning``
package has its own ``CheckpointIO`` class, which this plugin does not derive from.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import sys
import warnings
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import _C
from ._api import DtypeRules, PathArg, load_into, metadata, reserve_staging, reserved_staging_bytes
from ._api import load as load_snapshot
from ._dist import DistGroup
from ._errors import ErrorCode, error
from ._integration import (
    MANIFEST,
    Save,
    Saves,
    checked,
    optimizer_state_bytes,
    staging_bytes,
    untagged,
)
from ._tagged import ImportTypes as ImportTypes  # the type of import_types, public here
from ._tagged import Unresolved, restore_values, tagged, unresolved_in
from ._tree import SEP

__all__ = ["RECORD_KEY", "TsnapCheckpointIO", "TsnapModelParallelStrategy", "Unresolved", "load",
           "load_from_checkpoint"]

# The metadata key of the plugin's record in each snapshot's manifest.
RECORD_KEY = "tsnap_lightning"
_RECORD_FORMAT = 2  # 2 adds "values" (the tagged values); a reader of 1 ignores them
_PREFIX = "tsnap.lightning"
_VALUES_HINT = " (see docs/lightning.md for the values a checkpoint holds)"

MapLocation = Optional[Union[str, torch.device, Mapping[str, Any], Callable[..., Any]]]


def _error(code: ErrorCode, message: str) -> _C.Error:
    return error(code, f"{_PREFIX}: {message}")


def _abspath(path: PathArg) -> str:
    return os.path.abspath(os.fsdecode(os.fspath(path)))


# What identifies a tensor's bytes without reading them: a save whose tensors all have the
# fingerprints of the previous save's (and the same step) saves the same bytes.
_Fingerprint = tuple[Any, ...]


def _fingerprint(t: torch.Tensor) -> _Fingerprint | None:
    try:
        return (t.device, t.dtype, tuple(t.shape), t.stride(), t.storage_offset(),
                t.untyped_storage().data_ptr(), t._version)
    except (RuntimeError, NotImplementedError):  # sparse, meta, ...: never the same
        return None


class _Previous:
    """The last save into a directory: its step, tensor fingerprints and save."""

    __slots__ = ("fingerprints", "save", "step")

    def __init__(self, step: int, fingerprints: dict[str, _Fingerprint | None],
                 save: Save) -> None:
        self.step, self.fingerprints, self.save = step, fingerprints, save


# The plugins alive, waited for at interpreter exit (Fabric never calls teardown()).
_LIVE: weakref.WeakSet[TsnapCheckpointIO] = weakref.WeakSet()


# The plugins that reserve staging memory at the next optimizer step, and the one global hook
# that does it (registered once: a hook removed while the optimizer runs the hooks would change
# the dict it iterates).
_ARMED: weakref.WeakSet[TsnapCheckpointIO] = weakref.WeakSet()
_STEP_HOOK: Any = None


def _after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for plugin in list(_ARMED):
        _ARMED.discard(plugin)
        plugin._reserve(optimizer)


@atexit.register
def _wait_at_exit() -> None:
    for io in list(_LIVE):
        io._at_exit()


class TsnapCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that writes each checkpoint as a tsnap snapshot directory.

    Pass it to ``Trainer(plugins=[...])`` or ``Fabric(plugins=[...])``. ``ModelCheckpoint``
    (top-k, ``save_last``, ``every_n_train_steps``) and ``fit(ckpt_path="last")`` work
    unchanged: the checkpoint at ``dir/epoch=0-step=10.ckpt`` is the snapshot directory of
    that name, under the root ``dir``.

    Arguments:
        dtype: store floating weights and moments in this dtype (e.g. ``torch.bfloat16``);
            counters, 0-d tensors, integer and bool tensors keep theirs. Default: as they are
            (a load gives back bit-identical tensors).
        dtype_rules: per-key refinements of ``dtype``, first match wins, on the saved keys
            (``{"optimizer_states/*/exp_avg_sq": torch.float32}``), as in
            ``Snapshotter.save_async``.
        max_in_flight: saves writing at once per directory; one more waits in
            ``save_checkpoint`` for a slot (backpressure on a slow disk).
        staging_budget: bytes of staging buffers per directory (0: sized at the first save to
            hold it whole, at most a quarter of RAM).
        incremental: write only the chunks that differ from the previous snapshot in the same
            directory; unchanged shard files become hard links.
        verify: check every chunk's hash when loading.
        import_types: which classes a load may import to restore a class or an enum member
            that the checkpoint names (in hyper-parameters, say): False (default) imports none
            and returns a ``tsnap.lightning.Unresolved`` in its place, True any, or a
            collection of qualified names (``{"mypkg.config.Mode"}``). Builtin classes, and
            those of pathlib, collections, argparse and omegaconf, need no permission.
        link_same_step: when a save has the same ``global_step`` as the previous save into
            the same directory and the same tensors, unchanged since (``ModelCheckpoint``
            saving ``last.ckpt`` right after a top-k checkpoint), wait for that save to commit
            and hard-link its shard files instead of writing the bytes again.
        snapshotter_options: other keyword arguments of ``tsnap.Snapshotter`` (``chunk_bytes``,
            ``stage_threads``, ``io_threads``, ``engine``, ``direct_io``, ...).

    Each directory saved to gets its own ``tsnap.Snapshotter`` (its own staging buffers, reused
    by every save there), made at its first save and closed by ``teardown()``. The first
    save's buffers are reserved after the first optimizer step (the state is known then, the
    directory only at the save) and faulted in while training goes on
    (``tsnap.reserve_staging``), so the first save stalls about as long as the later ones.
    Thread-safety: Lightning calls a plugin from the training thread; so must other callers
    (one call at a time). Saves on rank 0 only (the strategy's choice), loads on every rank.
    """

    def __init__(self, *, dtype: torch.dtype | None = None, dtype_rules: DtypeRules = None,
                 max_in_flight: int = 2, staging_budget: int = 0, incremental: bool = False,
                 verify: bool = True, import_types: ImportTypes = False,
                 link_same_step: bool = True, **snapshotter_options: Any) -> None:
        super().__init__()
        why = {"root": "each checkpoint's directory is its root",
               "group": "a Lightning strategy saves the whole state on rank 0"}
        for key in ("root", "group"):
            if key in snapshotter_options:
                raise _error("invalid_argument", f"'{key}' is not an option here: {why[key]}")
        if int(max_in_flight) < 1:
            raise _error("invalid_argument", f"max_in_flight must be >= 1, not {max_in_flight}")
        self._dtype = dtype
        self._dtype_rules = dtype_rules
        self._verify = bool(verify)
        self._import_types: ImportTypes = (
            import_types if isinstance(import_types, bool) else frozenset(import_types))
        self._link_same_step = bool(link_same_step)
        self._options = dict(snapshotter_options, max_in_flight=int(max_in_flight),
                             staging_budget=int(staging_budget), incremental=bool(incremental))
        self._saves = Saves(_PREFIX, self._options)
        self._previous: dict[str, _Previous] = {}  # by directory
        self._every_rank = False  # True once a sharded strategy saves on every rank
        self._reserved = False
        self._arm_reserve()
        _LIVE.add(self)

    # -- CheckpointIO --------------------------------------------------------------------------

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathArg,
                        storage_options: Any | None = None) -> None:
        """Starts saving ``checkpoint`` as the snapshot directory ``path`` and returns once its
        tensors are staged; the write and the commit run in the background.

        An existing snapshot at ``path`` is replaced atomically when the new one commits (a
        save of ``path`` still in flight is waited for first). Raises tsnap.InvalidArgument for
        ``storage_options`` (none are supported) or a value that a snapshot cannot hold (named
        by its key), tsnap.Error when ``path`` holds something other than a tsnap snapshot,
        and the failure of an earlier save not raised yet (this save is then not started).
        """
        if storage_options is not None:
            raise _error("invalid_argument", "storage_options are not supported (got a "
                         f"{type(storage_options).__name__})")
        target = _abspath(path)
        if not isinstance(checkpoint, dict):
            raise _error("invalid_argument", f"a checkpoint is a dict, not "
                         f"{type(checkpoint).__name__} (saving {target})")
        self._saves.ready()
        _ARMED.discard(self)  # this save makes the pool: nothing to reserve at a later step
        root = os.path.dirname(target)
        values: list[list[Any]] = []
        try:
            stored = tagged(checkpoint, [], values)
        except (TypeError, ValueError) as e:
            raise _error("invalid_argument", f"cannot save the checkpoint {target}: "
                         f"{untagged(e)}{_VALUES_HINT}") from None
        # Every value representable, named by its key if not.
        tensors = checked(stored, _PREFIX, f"the checkpoint {target}", _VALUES_HINT)
        meta = _metadata_of(checkpoint, target, values)
        incremental = self._same_step(root, meta.get("step"), tensors)
        # A newer save of this path supersedes a queued removal of it.
        save = self._saves.start(target, stored, meta, overwrite=True, dtype=self._dtype,
                                 dtype_rules=self._dtype_rules, incremental=incremental)
        step = meta.get("step")
        if isinstance(step, int):
            self._previous[os.path.realpath(root)] = _Previous(
                step, {k: _fingerprint(t) for k, t in tensors.items()}, save)

    def load_checkpoint(self, path: PathArg, map_location: MapLocation = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint dict saved at ``path``, with the same structure and values.

        A save of ``path`` in flight is waited for first (its failure is raised). Tensors come
        back on the CPU, in their stored dtype; ``map_location`` moves them as ``torch.load``
        would: a device or its name, ``{"cpu": device}``, or a callable called with each
        tensor's storage and ``"cpu"`` (the tensor goes to the device of the storage it
        returns; None keeps it). ``weights_only`` changes nothing: a snapshot holds no code to
        run. Raises FileNotFoundError when nothing is at ``path`` (as Lightning's own plugin
        does), tsnap.FormatError when it is not a tsnap snapshot or is corrupt (a chunk whose
        hash does not match, with ``verify``).
        """
        del weights_only  # nothing is unpickled, whatever it says
        return self._load(_abspath(path), map_location)

    def _load(self, target: str, map_location: MapLocation = None,
              exclude: list[str] | None = None) -> dict[str, Any]:
        """``load_checkpoint``, less the tensors whose keys ``exclude`` (globs) matches."""
        self._saves.wait_for(target)
        if not os.path.lexists(target):
            raise FileNotFoundError(f"Checkpoint file not found: {target}")
        if not os.path.isdir(target):
            raise _error("unsupported_format",
                         f"{target} is not a tsnap snapshot: TsnapCheckpointIO stores each "
                         "checkpoint as a directory (a file written by Lightning's default "
                         "TorchCheckpointIO loads without this plugin)")
        if not os.path.isfile(os.path.join(target, MANIFEST)):
            raise _error("unsupported_format",
                         f"{target} is a directory without {MANIFEST}: not a tsnap snapshot")
        state = load_snapshot(target, exclude=exclude, verify=self._verify)
        record = metadata(target).get(RECORD_KEY)
        if isinstance(record, dict):
            _restore_module_metadata(state, record, target)
            state = restore_values(state, record, target, self._import_types, RECORD_KEY)
        if map_location is not None:
            state = _mapped(state, map_location)
        return state

    def remove_checkpoint(self, path: PathArg) -> None:
        """Removes the checkpoint at ``path`` (a snapshot directory, or a file or link).

        While saves of this plugin are in flight the removal is queued until they have
        committed (so neither a snapshot being written nor the newest committed one while a
        newer save may still fail is removed), and done by a later call (``save_checkpoint``,
        ``remove_checkpoint``, ``load_checkpoint``, ``wait``, ``teardown``); if one of those
        saves fails, the snapshot is kept (with a warning). A snapshot directory is first
        renamed to a temporary name (readers skip it; the next writer in that directory removes
        a leftover), so it never looks committed while half removed. A missing path is no
        error. Raises tsnap.IoError when a removal done now fails.
        """
        self._saves.remove(_abspath(path))

    def teardown(self) -> None:
        """Waits for every save (and queued removal), closes the Snapshotters (their staging
        buffers are freed; a later save makes new ones) and raises the first save failure not
        raised yet (the others are reported as warnings)."""
        try:
            self._saves.close()
        finally:
            self._previous = {}
            if self._reserved and reserved_staging_bytes() > 0:
                reserve_staging(0)  # never taken: no save came
            self._reserved = False
            self._arm_reserve()  # a later fit's first save gets its memory ready too

    # -- beyond CheckpointIO -------------------------------------------------------------------

    def wait(self) -> None:
        """Waits until every save in flight has committed or failed and the queued removals
        are done; raises the first save failure not raised yet (the others as warnings)."""
        self._saves.wait()

    @property
    def in_flight(self) -> list[str]:
        """The paths of the saves not known to be complete, oldest first."""
        return self._saves.in_flight

    # -- internals -----------------------------------------------------------------------------

    def _arm_reserve(self) -> None:
        """Reserves the first save's staging memory after the next optimizer step (any
        optimizer's in this process), where the state is known but not the directory it will be
        saved to: the memory is faulted in while training goes on, and the first save's pool
        takes it (``tsnap.reserve_staging``), so that save stalls about as long as the later
        ones. Skipped on the ranks that do not save, and once a save has made its pool."""
        global _STEP_HOOK
        if _STEP_HOOK is None:
            _STEP_HOOK = register_optimizer_step_post_hook(_after_step)
        _ARMED.add(self)

    def _reserve(self, optimizer: torch.optim.Optimizer) -> None:
        saves_here = (self._every_rank or not torch.distributed.is_available()
                      or not torch.distributed.is_initialized()
                      or torch.distributed.get_rank() == 0)
        if not saves_here or self._saves.started():
            return
        try:
            reserve_staging(staging_bytes(optimizer_state_bytes(optimizer, self._dtype),
                                          self._options))
            self._reserved = True
        except Exception as e:  # advisory, never the training step's failure: the first save
            # makes its pool as before
            warnings.warn(f"{_PREFIX}: could not reserve the first save's staging memory: {e}",
                          stacklevel=2)

    def _join(self, group: DistGroup) -> None:
        """Makes every later save a distributed one: each rank of ``group`` calls
        ``save_checkpoint`` with the same path and writes its part (the pieces of its DTensors,
        its share of the replicated tensors); rank 0 commits."""
        if self._saves.unfinished():
            self._saves.wait()
        self._saves = Saves(_PREFIX, dict(self._options, group=group))
        self._every_rank = True
        self._link_same_step = False  # each rank's last save may differ: no guess across ranks

    def _same_step(self, root: str, step: Any,
                   tensors: Mapping[str, torch.Tensor]) -> bool | None:
        """Whether to save incrementally (None: as configured): True, after waiting for the
        previous save into ``root``, when it had this step and most of these tensors' bytes,
        unchanged since, so that the save links its files (an incremental save proves each
        chunk equal before it links, so a wrong guess costs bytes, never correctness)."""
        previous = self._previous.get(os.path.realpath(root))
        if (not self._link_same_step or previous is None or not isinstance(step, int)
                or previous.step != step):
            return None
        total = same = 0
        for key, t in tensors.items():
            size = t.numel() * t.element_size()
            total += size
            fingerprint = _fingerprint(t)
            if fingerprint is not None and previous.fingerprints.get(key) == fingerprint:
                same += size
        if total == 0 or 2 * same < total:
            return None
        # The base of an incremental save is the snapshot its Snapshotter committed last: wait
        # for every save into ``root`` (failures are raised by the next call).
        self._saves.wait_in(root)
        return True if previous.save.error is None else None

    def _at_exit(self) -> None:
        """At interpreter exit: waits for the saves in flight and reports a failure on
        stderr (an exception raised there would be printed as an unrelated traceback)."""
        pending = self._saves.unfinished()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.teardown()
            others = [str(w.message) for w in caught]
        except Exception as e:
            others = [str(w.message) for w in caught] + [
                f"tsnap.lightning: at interpreter exit, a checkpoint save failed: {e}"]
        for text in others:
            print(text, file=sys.stderr)
        if others and pending:
            print(f"tsnap.lightning: waited at interpreter exit for {len(pending)} save(s) "
                  f"({', '.join(pending)}); call teardown() or wait() to see failures earlier",
                  file=sys.stderr)


class TsnapModelParallelStrategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 ``fully_shard`` and tensor parallelism in
    ``configure_model``) whose sharded checkpoints are tsnap snapshots, saved in the background;
    takes ``ModelParallelStrategy``'s arguments, and ``tsnap_options`` (a dict of
    ``TsnapCheckpointIO``'s: ``dtype``, ``max_in_flight``, ``staging_budget``, ...)::

        trainer = Trainer(strategy=TsnapModelParallelStrategy(data_parallel_size=8), ...)

    A checkpoint is one snapshot directory at the path Lightning names, written by every rank
    together through a ``tsnap.DistGroup`` on the store of the strategy's process group: each
    rank writes its pieces of the sharded weights and optimizer moments (DTensors), the
    replicated tensors are written once, rank 0 commits. ``save_checkpoint`` returns on each rank
    once its tensors are staged. A load reads each rank's own region of every weight and moment,
    whatever world size or mesh saved it; ``tsnap.lightning.load(path)`` gives the whole tensors
    in one process. Removals, failures and ``teardown()`` behave as with ``TsnapCheckpointIO``;
    a checkpoint that is not a tsnap snapshot (written by ``ModelParallelStrategy``) loads as
    Lightning loads it. ``save_distributed_checkpoint=False`` is refused: it gathers the whole
    state on rank 0, and a snapshot of the shards loads on any world size anyway.
    """

    def __init__(self, *args: Any, tsnap_options: Mapping[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self._save_distributed_checkpoint:
            raise _error("invalid_argument", "TsnapModelParallelStrategy saves each rank's "
                         "shards (save_distributed_checkpoint=True); a snapshot of them loads on "
                         "any world size, and tsnap.lightning.load gives the whole tensors")
        self._tsnap = TsnapCheckpointIO(**dict(tsnap_options or {}))
        self._tsnap_joined = False

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: PathArg,
                        storage_options: Any | None = None) -> None:
        """Starts saving ``checkpoint`` (called on every rank) as the snapshot directory
        ``filepath`` (rank 0's path); returns once this rank's tensors are staged. Raises as
        ``TsnapCheckpointIO.save_checkpoint``."""
        path = self.broadcast(_abspath(filepath))
        self._tsnap_io().save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, checkpoint_path: PathArg,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """Loads the weights and optimizer states (called on every rank, after setup) into the
        sharded model and optimizers, and returns the rest of the checkpoint (a checkpoint
        that is not a tsnap snapshot loads as ``ModelParallelStrategy`` loads it). Raises as
        ``TsnapCheckpointIO.load_checkpoint``, and tsnap.InvalidArgument, before anything is
        written, when the snapshot lacks a weight or an optimizer state of the model, holds
        one of another shape, or (unless the module's ``strict_loading`` is False) holds a
        weight the model lacks."""
        path = self.broadcast(_abspath(checkpoint_path))
        if not os.path.isfile(os.path.join(path, MANIFEST)):
            loaded: dict[str, Any] = super().load_checkpoint(path, weights_only)
            return loaded
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        io = self._tsnap_io()
        model = self.model
        assert model is not None and self.lightning_module is not None
        strict = bool(self.lightning_module.strict_loading)
        checkpoint = io._load(path, exclude=[f"{k}{SEP}*" for k in ("state_dict",
                                                                     "optimizer_states")])
        model_state = get_model_state_dict(model)
        targets: dict[str, Any] = {"state_dict": model_state}
        optimizers = [o._optimizer if isinstance(o, LightningOptimizer) else o
                      for o in self.optimizers]
        saved = checkpoint.pop("optimizer_states", None)
        states = []
        if saved is not None and optimizers:
            if len(saved) != len(optimizers):
                raise _error("invalid_argument", f"{path} holds {len(saved)} optimizer "
                             f"states, the model has {len(optimizers)} optimizers")
            states = [get_optimizer_state_dict(model, o) for o in optimizers]
            targets["optimizer_states"] = [{"state": s["state"]} for s in states]
        load_into(path, targets, [f"{k}{SEP}*" for k in targets], strict=strict,
                  verify=io._verify)
        set_model_state_dict(model, model_state, options=StateDictOptions(strict=strict))
        for optimizer, state, record in zip(optimizers, states, saved or []):
            state["param_groups"] = record["param_groups"]
            set_optimizer_state_dict(model, optimizer, state)
        checkpoint.pop("state_dict", None)
        return checkpoint

    def remove_checkpoint(self, filepath: PathArg) -> None:
        """Removes the checkpoint at ``filepath`` on rank 0, as
        ``TsnapCheckpointIO.remove_checkpoint`` (a removal waits for the saves in flight)."""
        if self.is_global_zero:
            self._tsnap.remove_checkpoint(filepath)

    def teardown(self) -> None:
        """Waits for every save (raising the first failure), then tears down as Lightning
        does."""
        try:
            self._tsnap.teardown()
        finally:
            super().teardown()

    def _tsnap_io(self) -> TsnapCheckpointIO:
        """The plugin, joined at first use to the ranks' DistGroup (made on every rank)."""
        if not self._tsnap_joined:
            if self.world_size > 1:
                self._tsnap._join(DistGroup())
            self._tsnap_joined = True
        return self._tsnap


def load(path: PathArg, map_location: MapLocation = None, *, import_types: ImportTypes = False,
         verify: bool = True) -> dict[str, Any]:
    """The checkpoint dict saved by ``TsnapCheckpointIO`` at ``path`` (a snapshot directory),
    as ``torch.load`` returns a checkpoint file's: same structure, values and types.

    ``map_location`` as in ``TsnapCheckpointIO.load_checkpoint``; ``import_types`` and
    ``verify`` as the plugin's options. Raises FileNotFoundError when nothing is at ``path``,
    tsnap.FormatError when it is not a snapshot or is corrupt. Thread-safe (no shared state).
    """
    io = TsnapCheckpointIO(verify=verify, import_types=import_types)
    return io.load_checkpoint(path, map_location)


def load_from_checkpoint(cls: type[Any], path: PathArg, map_location: MapLocation = None, *,
                         strict: bool | None = None, import_types: ImportTypes = False,
                         **kwargs: Any) -> Any:
    """``cls.load_from_checkpoint(path, ...)`` for a snapshot written by ``TsnapCheckpointIO``
    (Lightning's own reads the path with ``torch.load``, which cannot read a directory).

    Builds ``cls`` (a ``LightningModule`` or ``LightningDataModule`` subclass) from the stored
    hyper-parameters, overridden by ``kwargs``, calls its ``on_load_checkpoint`` and loads the
    state dict, strictly unless ``strict=False`` or the module's ``strict_loading`` says
    otherwise, as Lightning does. The module is moved to the device of the loaded tensors
    (``map_location``; the CPU by default). Raises tsnap.Error when the hyper-parameters hold a
    class or enum member that ``import_types`` did not allow importing (naming its key), and
    what Lightning raises for missing or unexpected keys.
    """
    from lightning.pytorch import LightningModule
    from lightning.pytorch.core.saving import _load_state

    checkpoint = load(path, map_location, import_types=import_types)
    for key in (cls.CHECKPOINT_HYPER_PARAMS_KEY, cls.CHECKPOINT_HYPER_PARAMS_TYPE):
        found = unresolved_in(checkpoint.get(key), [key])
        if found is not None:
            raise _error("unsupported", f"cannot build {cls.__name__} from {_abspath(path)}: "
                         f"{found.message()}")
    hparams = checkpoint.setdefault(cls.CHECKPOINT_HYPER_PARAMS_KEY, {})
    if isinstance(hparams, argparse.Namespace):
        hparams = checkpoint[cls.CHECKPOINT_HYPER_PARAMS_KEY] = vars(hparams)
    hparams.update(kwargs)
    if not issubclass(cls, LightningModule):
        return _load_state(cls, checkpoint, **kwargs)
    module: Any = _load_state(cls, checkpoint, strict=strict, **kwargs)
    state_dict = checkpoint.get("state_dict") or {}
    tensor = next((t for t in state_dict.values() if isinstance(t, torch.Tensor)), None)
    return module if tensor is None else module.to(tensor.device)


def _metadata_of(checkpoint: dict[str, Any], target: str,
                 values: list[list[Any]]) -> dict[str, Any]:
    """The manifest metadata of a checkpoint: the step for ``tsnap.latest`` and the plugin's
    record (the version records of module state dicts, which torch.save would keep, and the
    tagged values)."""
    modules: list[list[Any]] = []
    _find_module_metadata(checkpoint, [], modules)
    for where, value in modules:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise _error("invalid_argument",
                         f"cannot save the checkpoint {target}: the '_metadata' of the state "
                         f"dict at '{SEP.join(map(str, where))}' is not JSON ({e})") from None
    record: dict[str, Any] = {"format": _RECORD_FORMAT, "module_metadata": modules}
    if values:
        record["values"] = values
    meta: dict[str, Any] = {RECORD_KEY: record}
    for key, name in (("global_step", "step"), ("epoch", "epoch")):
        value = checkpoint.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            meta[name] = value
    return meta


def _find_module_metadata(value: Any, where: list[Any], out: list[list[Any]]) -> None:
    if isinstance(value, dict):
        meta = getattr(value, "_metadata", None)
        if isinstance(value, collections.OrderedDict) and isinstance(meta, dict):
            out.append([list(where), {str(k): v for k, v in meta.items()}])
        for k, v in value.items():
            _find_module_metadata(v, where + [k], out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _find_module_metadata(v, where + [i], out)


def _restore_module_metadata(state: dict[Any, Any], record: dict[str, Any], target: str) -> None:
    entries = record.get("module_metadata", [])
    if not isinstance(entries, list):
        raise _error("bad_manifest", f"{target}: its '{RECORD_KEY}' record is not valid")
    for entry in entries:
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], list)
                or not isinstance(entry[1], dict)):
            raise _error("bad_manifest", f"{target}: its '{RECORD_KEY}' record is not valid")
        node: Any = state
        for part in entry[0]:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                node = None
                break
        if isinstance(node, collections.OrderedDict):
            node._metadata = collections.OrderedDict(entry[1])  # type: ignore[attr-defined]


def _mapped(state: dict[Any, Any], map_location: MapLocation) -> dict[Any, Any]:
    """``state`` with its tensors moved as ``torch.load(map_location=...)`` would move them
    from the CPU."""
    out = _apply(state, _mover(map_location))
    assert isinstance(out, dict)
    return out


def _mover(map_location: MapLocation) -> Callable[[torch.Tensor], torch.Tensor]:
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        return lambda t: t.to(device)
    if isinstance(map_location, Mapping):
        to = map_location.get("cpu")
        return lambda t: t if to is None else t.to(torch.device(to))
    if callable(map_location):
        fn = map_location

        def move(t: torch.Tensor) -> torch.Tensor:
            storage = fn(t.untyped_storage(), "cpu")
            return t if storage is None else t.to(storage.device)
        return move
    raise _error("invalid_argument", "map_location must be a device, a str, a dict or a "
                 f"callable, not {type(map_location).__name__}")


def _apply(value: Any, move: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return move(value)
    if isinstance(value, dict):
        for k in value:
            value[k] = _apply(value[k], move)
        return value
    if isinstance(value, list):
        value[:] = [_apply(v, move) for v in value]
        return value
    if isinstance(value, tuple):
        return tuple(_apply(v, move) for v in value)
    return value
