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
Not covered: strategies that write sharded checkpoints themselves (FSDP with
``state_dict_type="sharded"``, ``ModelParallelStrategy``, DeepSpeed) do not go through a
``CheckpointIO``; the standalone ``pytorch_lightning`` package has its own
``CheckpointIO`` class, which this plugin does not derive from.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import builtins
import collections
import enum
import errno as errno_names
import importlib
import json
import os
import pathlib
import secrets
import shutil
import sys
import time
import warnings
import weakref
from collections.abc import Collection, Mapping
from typing import Any, Callable, Optional, Union

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from . import _C
from ._api import DtypeRules, PathArg, SaveHandle, Snapshotter, metadata
from ._api import load as load_snapshot
from ._errors import _CLASSES, ErrorCode, error
from ._tree import SEP, flatten

__all__ = ["RECORD_KEY", "TsnapCheckpointIO", "Unresolved", "load", "load_from_checkpoint"]

# The metadata key of the plugin's record in each snapshot's manifest.
RECORD_KEY = "tsnap_lightning"
_RECORD_FORMAT = 2  # 2 adds "values" (the tagged values); a reader of 1 ignores them
_MANIFEST = "MANIFEST.json"

MapLocation = Optional[Union[str, torch.device, Mapping[str, Any], Callable[..., Any]]]
# Which classes a load may import to restore a type or an enum member: none (False), any (True),
# or these qualified names ("package.module.Class").
ImportTypes = Union[bool, Collection[str]]


def _error(code: ErrorCode, message: str) -> _C.Error:
    return error(code, f"tsnap.lightning: {message}")


def _abspath(path: PathArg) -> str:
    return os.path.abspath(os.fsdecode(os.fspath(path)))


def _same(a: str, b: str) -> bool:
    """Whether two absolute paths name the same checkpoint (one may be a link to the other)."""
    return a == b or os.path.realpath(a) == os.path.realpath(b)


class _Save:
    """One save in flight or completed: its path, handle and outcome."""

    __slots__ = ("error", "finished", "handle", "path")

    def __init__(self, path: str, handle: SaveHandle) -> None:
        self.path = path
        self.handle = handle
        self.finished = False
        self.error: BaseException | None = None


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
                 save: _Save) -> None:
        self.step, self.fingerprints, self.save = step, fingerprints, save


# The plugins alive, waited for at interpreter exit (Fabric never calls teardown()).
_LIVE: weakref.WeakSet[TsnapCheckpointIO] = weakref.WeakSet()


@atexit.register
def _wait_at_exit() -> None:
    for io in list(_LIVE):
        io._at_exit()


class _Removal:
    """A removal queued until the saves that were in flight when it was asked for complete."""

    __slots__ = ("after", "path")

    def __init__(self, path: str, after: list[_Save]) -> None:
        self.path = path
        self.after = after


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
    by every save there), made at its first save and closed by ``teardown()``.
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
        self._options: dict[str, Any] = dict(
            snapshotter_options, max_in_flight=int(max_in_flight),
            staging_budget=int(staging_budget), incremental=bool(incremental))
        self._snapshotters: dict[str, Snapshotter] = {}
        self._saves: list[_Save] = []         # in flight, oldest first
        self._removals: list[_Removal] = []   # queued, oldest first
        self._failures: list[BaseException] = []  # not raised yet
        self._previous: dict[str, _Previous] = {}  # by directory
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
        self._reap()
        self._raise_failure()
        root, name = os.path.split(target)
        values: list[list[Any]] = []
        try:
            stored = _tagged(checkpoint, [], values)
            tensors, _ = flatten(stored)  # every value representable, named by its key if not
        except (TypeError, ValueError) as e:
            raise _error("invalid_argument",
                         f"cannot save the checkpoint {target}: {_untagged(e)} (see "
                         "docs/lightning.md for the values a checkpoint holds)") from None
        meta = _metadata_of(checkpoint, target, values)
        os.makedirs(root, exist_ok=True)
        snap = self._snapshotter(root)
        # A newer save of this path supersedes a queued removal of it.
        self._removals = [r for r in self._removals if not _same(r.path, target)]
        incremental = self._same_step(root, meta.get("step"), tensors)
        handle = snap.save_async(name, stored, metadata=meta, dtype=self._dtype,
                                 dtype_rules=self._dtype_rules, overwrite=True,
                                 incremental=incremental)
        save = _Save(target, handle)
        self._saves.append(save)
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
        target = _abspath(path)
        self._wait_for(target)
        if not os.path.lexists(target):
            raise FileNotFoundError(f"Checkpoint file not found: {target}")
        if not os.path.isdir(target):
            raise _error("unsupported_format",
                         f"{target} is not a tsnap snapshot: TsnapCheckpointIO stores each "
                         "checkpoint as a directory (a file written by Lightning's default "
                         "TorchCheckpointIO loads without this plugin)")
        if not os.path.isfile(os.path.join(target, _MANIFEST)):
            raise _error("unsupported_format",
                         f"{target} is a directory without {_MANIFEST}: not a tsnap snapshot")
        state = load_snapshot(target, verify=self._verify)
        record = metadata(target).get(RECORD_KEY)
        if isinstance(record, dict):
            _restore_module_metadata(state, record, target)
            state = _restore_values(state, record, target, self._import_types)
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
        target = _abspath(path)
        self._reap()
        self._removals = [r for r in self._removals if not _same(r.path, target)]
        if self._saves:
            self._removals.append(_Removal(target, list(self._saves)))
            return
        _remove(target)

    def teardown(self) -> None:
        """Waits for every save (and queued removal), closes the Snapshotters (their staging
        buffers are freed; a later save makes new ones) and raises the first save failure not
        raised yet (the others are reported as warnings)."""
        try:
            self.wait()
        finally:
            snaps, self._snapshotters = list(self._snapshotters.values()), {}
            self._previous = {}
            for snap in snaps:
                snap.close()

    # -- beyond CheckpointIO -------------------------------------------------------------------

    def wait(self) -> None:
        """Waits until every save in flight has committed or failed and the queued removals
        are done; raises the first save failure not raised yet (the others as warnings)."""
        for save in self._saves:
            self._finish(save)
        self._saves = []
        self._run_removals()
        self._raise_failure(all_of_them=True)

    @property
    def in_flight(self) -> list[str]:
        """The paths of the saves not known to be complete, oldest first."""
        self._reap()
        return [s.path for s in self._saves]

    # -- internals -----------------------------------------------------------------------------

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
        for save in self._saves:
            if _same(os.path.dirname(save.path), root):
                self._finish(save)
        return True if previous.save.error is None else None

    def _at_exit(self) -> None:
        """At interpreter exit: waits for the saves in flight and reports a failure on
        stderr (an exception raised there would be printed as an unrelated traceback)."""
        pending = [s.path for s in self._saves if not s.finished]
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

    def _snapshotter(self, root: str) -> Snapshotter:
        key = os.path.realpath(root)
        snap = self._snapshotters.get(key)
        if snap is None:
            snap = Snapshotter(root, **self._options)
            self._snapshotters[key] = snap
        return snap

    def _finish(self, save: _Save) -> None:
        if save.finished:
            return
        try:
            save.handle.wait()
        except _C.Error as e:
            save.error = _failed(save.path, e)
            self._failures.append(save.error)
        save.finished = True

    def _reap(self) -> None:
        """Collects the saves that completed, then does the removals that may be done."""
        still: list[_Save] = []
        for save in self._saves:
            if save.handle.done():
                self._finish(save)
            else:
                still.append(save)
        self._saves = still
        self._run_removals()

    def _wait_for(self, target: str) -> None:
        """Waits for the saves of ``target``; raises the failure of the last one."""
        last: _Save | None = None
        for save in self._saves:
            if _same(save.path, target):
                self._finish(save)
                last = save
        self._reap()
        if last is not None and last.error is not None:
            self._failures = [f for f in self._failures if f is not last.error]
            raise last.error

    def _run_removals(self) -> None:
        queued: list[_Removal] = []
        for removal in self._removals:
            if not all(s.finished for s in removal.after):
                queued.append(removal)
                continue
            failed = [s for s in removal.after if s.error is not None]
            if failed:
                warnings.warn(f"tsnap.lightning: kept {removal.path}: the save of "
                              f"{failed[0].path} failed while its removal waited for it",
                              RuntimeWarning, stacklevel=3)
                continue
            try:
                _remove(removal.path)
            except _C.Error as e:
                self._failures.append(e)
        self._removals = queued

    def _raise_failure(self, all_of_them: bool = False) -> None:
        if not self._failures:
            return
        first, rest = self._failures[0], self._failures[1:]
        self._failures = []
        if all_of_them:
            for other in rest:
                warnings.warn(f"tsnap.lightning: another save failed too: {other}",
                              RuntimeWarning, stacklevel=3)
        else:
            self._failures = rest
        raise first


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
        found = _unresolved_in(checkpoint.get(key), [key])
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


def _failed(path: str, e: _C.Error) -> _C.Error:
    """The failure of the save of ``path``, naming it and the errno (ENOSPC) of ``e``."""
    code: Any = getattr(e, "code", "io")
    number = getattr(e, "errno", 0) or 0
    name = errno_names.errorcode.get(number)
    out = _error(code if code in _CLASSES else "io",
                 f"the save of {path} failed" + (f" ({name})" if name else "") +
                 f": {_untagged(e)}")
    out.errno = number
    out.__cause__ = e
    return out


def _untagged(e: BaseException) -> str:
    text = str(e)
    return text[len("tsnap: "):] if text.startswith("tsnap: ") else text


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


# -- values beyond the structure record: tagged ------------------------------------------------
#
# A value that tsnap's structure record cannot hold but that Lightning's checkpoints commonly
# carry is stored as a plain value (in the record, or its tensors in the shards) at the same
# key, and the plugin's record lists [key path, tag, info] for it, innermost first, so that a
# load turns the plain value back into one of the same type. The tags (docs/lightning.md):
#   namespace    argparse.Namespace      a dict of its attributes
#   path         pathlib paths           str; info: the pathlib class
#   bytes        bytes, bytearray        base64 str; info: which
#   set          set, frozenset          a list of the elements (sorted when they sort); info
#   counter      collections.Counter     a list of [key, count] pairs
#   defaultdict  collections.defaultdict a list of [key, value] pairs; info: the factory type
#   numpy        numpy scalar or array   its .tolist(); info: dtype (numpy's str) and shape
#   enum         enum.Enum member        its value; info: the class and the member name
#   type         a class                 None; info: module and qualname
#   omegaconf    DictConfig, ListConfig  OmegaConf.to_container(resolve=False); info: kind

_NUMPY_MAX = 4096  # elements of a numpy array stored in the record
_NUMPY_KINDS = "biufU"  # bool, int, uint, float, str
_PATH_CLASSES = ("PosixPath", "WindowsPath", "Path", "PurePosixPath", "PureWindowsPath",
                 "PurePath")
# Classes restored without ``import_types``: from the standard library, Lightning and omegaconf
# (imported only when installed), whatever the checkpoint says, never a class it names freely.
_KNOWN_TYPES = {
    "collections": {"OrderedDict", "Counter", "defaultdict", "deque"},
    "argparse": {"Namespace"},
    "pathlib": set(_PATH_CLASSES),
    "lightning.fabric.utilities.data": {"AttributeDict"},
    "omegaconf": {"DictConfig", "ListConfig"},
    "omegaconf.dictconfig": {"DictConfig"},
    "omegaconf.listconfig": {"ListConfig"},
}


class Unresolved:
    """What a load returns in place of a class, or an enum member, that a checkpoint names but
    that the load did not import (``import_types`` does not allow it, or the import failed).

    ``kind`` is ``"type"`` or ``"enum"``, ``name`` the class's qualified name
    (``"mypkg.config.Mode"``), ``member`` and ``value`` the enum member's name and stored value
    (None for a type), ``key`` where it was in the checkpoint (``"hyper_parameters/mode"``),
    ``why`` why it was not imported. Calling it (as a ``defaultdict`` calls its factory) raises
    tsnap.Error with that explanation; ``tsnap.lightning.load_from_checkpoint`` refuses
    hyper-parameters that hold one.
    """

    __slots__ = ("key", "kind", "member", "name", "value", "why")

    def __init__(self, kind: str, name: str, key: str, why: str, member: str | None = None,
                 value: Any = None) -> None:
        self.kind, self.name, self.key, self.why = kind, name, key, why
        self.member, self.value = member, value

    def message(self) -> str:
        what = f"the enum member {self.name}.{self.member}" if self.kind == "enum" else \
            f"the class {self.name}"
        return (f"'{self.key}' holds {what}, not imported ({self.why}); pass "
                f"import_types=True or import_types=[{self.name!r}] to import it")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _error("unsupported", self.message())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unresolved) and (
            self.kind, self.name, self.member, self.value) == (
            other.kind, other.name, other.member, other.value)

    def __hash__(self) -> int:
        return hash((self.kind, self.name, self.member))

    def __repr__(self) -> str:
        what = f"{self.name}.{self.member}" if self.kind == "enum" else self.name
        return f"<tsnap.lightning.Unresolved {self.kind} {what} at '{self.key}'>"


def _path_text(where: list[Any]) -> str:
    return f"'{SEP.join(map(str, where))}'" if where else "the top level"


def _type_info(cls: type, where: list[Any]) -> dict[str, str]:
    module, qualname = getattr(cls, "__module__", None), getattr(cls, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        raise TypeError(f"tsnap: cannot save the class {cls!r} at {_path_text(where)}: it has "
                        "no importable qualified name (a class defined in a function?)")
    return {"module": module, "qualname": qualname}


def _tagged(value: Any, where: list[Any], out: list[list[Any]]) -> Any:
    """``value`` with every value beyond the structure record replaced by its plain stand-in
    (``value`` itself when there is none; containers are copied only where something changed),
    appending [path, tag, info] to ``out`` for each, innermost first. Raises TypeError naming
    the key for a value of a supported type that cannot be stored (a local class, a big or
    complex numpy array, a defaultdict whose factory is not a class)."""
    if isinstance(value, torch.Tensor) or value is None or type(value) in (bool, int, float, str):
        return value
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, (np.generic, np.ndarray)):
        dtype = value.dtype
        if dtype.kind not in _NUMPY_KINDS or (isinstance(value, np.ndarray)
                                              and value.size > _NUMPY_MAX):
            raise TypeError(f"tsnap: cannot save the numpy {type(value).__name__} of dtype "
                            f"{dtype} and {value.size} element(s) at {_path_text(where)}: the "
                            f"checkpoint keeps numpy values of bool, int, uint, float or str "
                            f"dtype of at most {_NUMPY_MAX} elements (store a big array as a "
                            "tensor: torch.from_numpy)")
        shape = list(value.shape) if isinstance(value, np.ndarray) else None
        out.append([list(where), "numpy", {"dtype": dtype.str, "shape": shape}])
        return value.tolist()
    if isinstance(value, enum.Enum):
        info = _type_info(type(value), where)
        inner = _tagged(value.value, where, out)
        out.append([list(where), "enum", dict(info, member=value.name or "")])
        return inner
    if isinstance(value, type):
        out.append([list(where), "type", _type_info(value, where)])
        return None
    if isinstance(value, argparse.Namespace):
        attributes = {k: _tagged(v, where + [k], out) for k, v in vars(value).items()}
        out.append([list(where), "namespace", {}])
        return attributes
    if isinstance(value, pathlib.PurePath):
        cls = next(c.__name__ for c in type(value).__mro__
                   if c.__module__ == "pathlib" and c.__name__ in _PATH_CLASSES)
        out.append([list(where), "path", {"class": cls}])
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        out.append([list(where), "bytes", {"class": type(value).__name__}])
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (set, frozenset)):
        try:
            elements = sorted(value)
        except TypeError:
            elements = list(value)
        members = [_tagged(v, where + [i], out) for i, v in enumerate(elements)]
        out.append([list(where), "set", {"class": "frozenset" if isinstance(value, frozenset)
                                         else "set"}])
        return members
    if isinstance(value, (collections.Counter, collections.defaultdict)):
        pairs = [[_tagged(k, where + [i, 0], out), _tagged(v, where + [i, 1], out)]
                 for i, (k, v) in enumerate(value.items())]
        if isinstance(value, collections.Counter):
            out.append([list(where), "counter", {}])
            return pairs
        factory = value.default_factory
        if factory is not None and not isinstance(factory, type):
            raise TypeError(f"tsnap: cannot save the defaultdict at {_path_text(where)}: its "
                            f"default_factory {factory!r} is not a class")
        out.append([list(where), "defaultdict", {
            "factory": None if factory is None else _type_info(factory, where)}])
        return pairs
    oc = sys.modules.get("omegaconf")
    if oc is not None and isinstance(value, (oc.DictConfig, oc.ListConfig)):
        plain = oc.OmegaConf.to_container(value, resolve=False)
        inner = _tagged(plain, where, out)
        out.append([list(where), "omegaconf", {"kind": type(value).__name__}])
        return inner
    if isinstance(value, dict):
        changed = False
        items: list[tuple[Any, Any]] = []
        for k, v in value.items():
            new = _tagged(v, where + [k], out)
            changed = changed or new is not v
            items.append((k, new))
        if not changed:
            return value
        copy: dict[Any, Any] = (collections.OrderedDict(items)
                                if isinstance(value, collections.OrderedDict) else dict(items))
        meta = getattr(value, "_metadata", None)
        if meta is not None:
            copy._metadata = meta  # type: ignore[attr-defined]
        return copy
    if isinstance(value, (list, tuple)):
        new_items = [_tagged(v, where + [i], out) for i, v in enumerate(value)]
        if all(a is b for a, b in zip(new_items, value)):
            return value
        return tuple(new_items) if isinstance(value, tuple) else new_items
    return value  # a plain value, or one that flatten refuses naming its key


def _allowed(import_types: ImportTypes, name: str) -> bool:
    if isinstance(import_types, bool):
        return import_types
    return name in import_types


def _resolve(info: Any, key: str, import_types: ImportTypes, target: str) -> Any:
    """The class ``info`` names: a builtin or a known class, else one ``import_types`` allows
    importing, else an Unresolved."""
    if (not isinstance(info, dict) or not isinstance(info.get("module"), str)
            or not isinstance(info.get("qualname"), str)):
        raise _error("bad_manifest", f"{target}: the class recorded at '{key}' is not valid")
    module, qualname = info["module"], info["qualname"]
    name = f"{module}.{qualname}"
    if module == "builtins":
        found = getattr(builtins, qualname, None)
        return found if isinstance(found, type) else Unresolved(
            "type", name, key, "not a builtin class")
    known = qualname in _KNOWN_TYPES.get(module, ())
    if not known and not _allowed(import_types, name):
        return Unresolved("type", name, key, "import_types does not allow it")
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception as e:  # an import runs the module's code: any error
        return Unresolved("type", name, key, f"importing it failed: {e}")
    if not isinstance(found, type):
        return Unresolved("type", name, key, "it is not a class")
    return found


def _restored(tag: str, node: Any, info: dict[str, Any], key: str, import_types: ImportTypes,
              target: str) -> Any:
    def bad(what: str) -> _C.Error:
        return _error("bad_manifest", f"{target}: the {tag} value at '{key}' is not valid: "
                      f"{what}")

    def pairs() -> list[tuple[Any, Any]]:
        if not isinstance(node, list) or not all(isinstance(p, list) and len(p) == 2
                                                 for p in node):
            raise bad("not a list of pairs")
        try:
            return [(k, v) for k, v in node if hash(k) is not None]
        except TypeError:
            raise bad("a key is not hashable") from None

    if tag == "namespace":
        if not isinstance(node, dict) or not all(isinstance(k, str) for k in node):
            raise bad("not a dict with str keys")
        return argparse.Namespace(**node)
    if tag == "path":
        cls = info.get("class")
        if not isinstance(node, str) or cls not in _PATH_CLASSES:
            raise bad("not a str and a pathlib class")
        try:
            return getattr(pathlib, cls)(node)
        except NotImplementedError:  # a WindowsPath on POSIX, or the reverse
            return pathlib.Path(node)
    if tag == "bytes":
        if not isinstance(node, str) or info.get("class") not in ("bytes", "bytearray"):
            raise bad("not base64 text")
        try:
            data = base64.b64decode(node.encode("ascii"), validate=True)
        except ValueError:
            raise bad("not base64 text") from None
        return data if info["class"] == "bytes" else bytearray(data)
    if tag == "set":
        if not isinstance(node, list) or info.get("class") not in ("set", "frozenset"):
            raise bad("not a list")
        try:
            return set(node) if info["class"] == "set" else frozenset(node)
        except TypeError:
            raise bad("an element is not hashable") from None
    if tag == "counter":
        return collections.Counter(dict(pairs()))
    if tag == "defaultdict":
        factory = info.get("factory")
        made = None if factory is None else _resolve(factory, key, import_types, target)
        return collections.defaultdict(made, pairs())
    if tag == "numpy":
        dtype, shape = info.get("dtype"), info.get("shape")
        if not isinstance(dtype, str) or not (shape is None or isinstance(shape, list)):
            raise bad("no dtype and shape")
        try:
            import numpy as np
        except ImportError:
            raise _error("unsupported", f"{target}: '{key}' holds a numpy value and numpy is "
                         "not installed") from None
        try:
            array = np.array(node, dtype=np.dtype(dtype))
            if shape is None:
                return array[()]
            return array.reshape(shape)
        except (TypeError, ValueError) as e:
            raise bad(str(e)) from None
    if tag == "enum":
        cls = _resolve(info, key, import_types, target)
        name = f"{info['module']}.{info['qualname']}"
        member = info.get("member")
        if not isinstance(member, str):
            raise bad("no member name")
        if isinstance(cls, Unresolved):
            return Unresolved("enum", name, key, cls.why, member, node)
        if not issubclass(cls, enum.Enum):
            return Unresolved("enum", name, key, "it is not an Enum", member, node)
        try:
            return cls[member]
        except KeyError:  # a combination of flags, or a renamed member: by value
            pass
        try:
            return cls(node)
        except (ValueError, TypeError):
            return Unresolved("enum", name, key, f"it has no member {member!r} or value "
                              f"{node!r}", member, node)
    if tag == "type":
        return _resolve(info, key, import_types, target)
    if tag == "omegaconf":
        try:
            from omegaconf import OmegaConf  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            warnings.warn(f"tsnap.lightning: {target}: '{key}' was an omegaconf "
                          f"{info.get('kind')}; omegaconf is not installed, so it is loaded as "
                          "a plain container", RuntimeWarning, stacklevel=4)
            return node
        return OmegaConf.create(node)
    raise _error("bad_manifest", f"{target}: unknown value tag {tag!r} at '{key}'")


def _replaced(node: Any, path: list[Any], fn: Callable[[Any], Any]) -> Any:
    """``node`` with the value at ``path`` replaced by ``fn(value)`` (tuples rebuilt)."""
    if not path:
        return fn(node)
    head, rest = path[0], path[1:]
    new = _replaced(node[head], rest, fn)
    if isinstance(node, tuple):
        return node[:head] + (new,) + node[head + 1:]
    node[head] = new
    return node


def _restore_values(state: dict[Any, Any], record: dict[str, Any], target: str,
                    import_types: ImportTypes) -> dict[Any, Any]:
    entries = record.get("values", [])
    if not isinstance(entries, list):
        raise _error("bad_manifest", f"{target}: its '{RECORD_KEY}' record is not valid")
    for entry in entries:
        if (not isinstance(entry, list) or len(entry) != 3 or not isinstance(entry[0], list)
                or not entry[0] or not isinstance(entry[1], str)
                or not isinstance(entry[2], dict)):
            raise _error("bad_manifest", f"{target}: its '{RECORD_KEY}' record is not valid")
        path, tag, info = entry
        key = SEP.join(map(str, path))
        def restore(node: Any, tag: str = tag, info: dict[str, Any] = info,
                    key: str = key) -> Any:
            return _restored(tag, node, info, key, import_types, target)
        try:
            state = _replaced(state, path, restore)
        except (KeyError, IndexError, TypeError):
            raise _error("bad_manifest", f"{target}: its '{RECORD_KEY}' record names '{key}', "
                         "which the checkpoint does not hold") from None
    return state


def _unresolved_in(value: Any, where: list[Any]) -> Unresolved | None:
    if isinstance(value, Unresolved):
        return value
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, collections.defaultdict) and isinstance(value.default_factory,
                                                                 Unresolved):
        return value.default_factory
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        found = _unresolved_in(v, where + [k])
        if found is not None:
            return found
    return None


def _remove(path: str) -> None:
    try:
        if os.path.islink(path) or os.path.isfile(path):
            os.remove(path)
        elif os.path.isdir(path) and os.path.isfile(os.path.join(path, _MANIFEST)):
            # tsnap::remove_snapshot's protocol: rename to a temporary name first.
            root, name = os.path.split(path)
            temporary = os.path.join(
                root, f".{name}.tmp-{time.time_ns():016x}-{secrets.randbits(32):08x}")
            os.rename(path, temporary)
            shutil.rmtree(temporary, ignore_errors=True)  # a leftover: the next writer's
        elif os.path.isdir(path):
            shutil.rmtree(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise _error("io", f"cannot remove the checkpoint {path}: {e}") from None


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
