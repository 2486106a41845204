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
tuples, int, float, bool, str, None, torch dtypes): nothing is pickled, and loading never runs
code. A value outside that set is a ``tsnap.InvalidArgument`` naming its key
(``hyper_parameters/config``) before anything is written.

``save_checkpoint`` returns once the tensors are staged (copied into tsnap's buffers); the write
and the commit run in the background. Lightning's next calls see a consistent picture:
``load_checkpoint`` of a path being written waits for it; ``remove_checkpoint`` never removes a
snapshot while saves of this plugin are in flight (the removal is queued until they commit, and
dropped, keeping the snapshot, if one of them fails), so the newest committed checkpoint
survives a save that fails; ``teardown()`` (Lightning calls it at the end of ``fit``,
``validate``, ``test``) waits for every save and raises the first failure. A failure is also
raised by the next ``save_checkpoint``.

Not covered: ``LightningModule.load_from_checkpoint`` and ``lightning.pytorch.core.saving``
read files with ``torch.load`` themselves, not through the plugin (load through
``trainer.fit/validate/test(ckpt_path=...)``, or ``TsnapCheckpointIO().load_checkpoint(path)``
and ``model.load_state_dict(ckpt["state_dict"])``); strategies that write sharded checkpoints
themselves (FSDP with ``state_dict_type="sharded"``, ``ModelParallelStrategy``, DeepSpeed) do
not go through a ``CheckpointIO``; the standalone ``pytorch_lightning`` package has its own
``CheckpointIO`` class, which this plugin does not derive from.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import time
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from . import _C
from ._api import DtypeRules, PathArg, SaveHandle, Snapshotter, load, metadata
from ._errors import ErrorCode, error
from ._tree import SEP, flatten

__all__ = ["RECORD_KEY", "TsnapCheckpointIO"]

# The metadata key of the plugin's record in each snapshot's manifest.
RECORD_KEY = "tsnap_lightning"
_RECORD_FORMAT = 1
_MANIFEST = "MANIFEST.json"

MapLocation = Optional[Union[str, torch.device, Mapping[str, Any], Callable[..., Any]]]


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
        snapshotter_options: other keyword arguments of ``tsnap.Snapshotter`` (``chunk_bytes``,
            ``stage_threads``, ``io_threads``, ``engine``, ``direct_io``, ...).

    Each directory saved to gets its own ``tsnap.Snapshotter`` (its own staging buffers, reused
    by every save there), made at its first save and closed by ``teardown()``.
    Thread-safety: Lightning calls a plugin from the training thread; so must other callers
    (one call at a time). Saves on rank 0 only (the strategy's choice), loads on every rank.
    """

    def __init__(self, *, dtype: torch.dtype | None = None, dtype_rules: DtypeRules = None,
                 max_in_flight: int = 2, staging_budget: int = 0, incremental: bool = False,
                 verify: bool = True, **snapshotter_options: Any) -> None:
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
        self._options: dict[str, Any] = dict(
            snapshotter_options, max_in_flight=int(max_in_flight),
            staging_budget=int(staging_budget), incremental=bool(incremental))
        self._snapshotters: dict[str, Snapshotter] = {}
        self._saves: list[_Save] = []         # in flight, oldest first
        self._removals: list[_Removal] = []   # queued, oldest first
        self._failures: list[BaseException] = []  # not raised yet

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
        try:
            flatten(checkpoint)  # every value representable, each named by its key if not
        except (TypeError, ValueError) as e:
            raise _error("invalid_argument",
                         f"cannot save the checkpoint {target}: {_untagged(e)}") from None
        meta = _metadata_of(checkpoint, target)
        os.makedirs(root, exist_ok=True)
        snap = self._snapshotter(root)
        # A newer save of this path supersedes a queued removal of it.
        self._removals = [r for r in self._removals if not _same(r.path, target)]
        handle = snap.save_async(name, checkpoint, metadata=meta, dtype=self._dtype,
                                 dtype_rules=self._dtype_rules, overwrite=True)
        self._saves.append(_Save(target, handle))

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
        state = load(target, verify=self._verify)
        record = metadata(target).get(RECORD_KEY)
        if isinstance(record, dict):
            _restore_module_metadata(state, record, target)
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
            save.error = e
            self._failures.append(e)
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


def _untagged(e: BaseException) -> str:
    text = str(e)
    return text[len("tsnap: "):] if text.startswith("tsnap: ") else text


def _metadata_of(checkpoint: dict[str, Any], target: str) -> dict[str, Any]:
    """The manifest metadata of a checkpoint: the step for ``tsnap.latest`` and the plugin's
    record (the version records of module state dicts, which torch.save would keep)."""
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
