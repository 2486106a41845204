"""tsnap as a storage layer of ``torch.distributed.checkpoint`` (DCP).

Existing DCP code switches to tsnap with one argument::

    import torch.distributed.checkpoint as dcp
    import tsnap.dcp

    dcp.save(state_dict, storage_writer=tsnap.dcp.StorageWriter("ckpt/step-100"))
    fut = dcp.async_save(state_dict, storage_writer=tsnap.dcp.StorageWriter("ckpt/step-200"))
    ...
    dcp.load(state_dict, storage_reader=tsnap.dcp.StorageReader("ckpt/step-200"))

What is written is a tsnap snapshot (``<root>/<name>/`` with ``root`` the parent directory of
the path): safetensors shard files and a ``MANIFEST.json`` with one XXH3-64 hash per chunk,
committed atomically (the directory appears under its final name only once every rank's files
are durable), so ``tsnap verify``, ``tsnap ls``, ``tsnap inspect``, ``tsnap.verify`` and
``tsnap.load`` work on it. Each DCP tensor write item is stored under its fully qualified name
(``"model.fc1.weight"``, ``"optim.state.fc1.weight.exp_avg"``): a whole tensor as an ordinary
tensor, one rank's chunk of a sharded tensor (``DTensor``, ``ShardedTensor``) as a piece with
its global shape and offsets. DCP's non-tensor values (the step counter, learning rates, ...,
which DCP's planner hands over as ``torch.save`` bytes) are stored as ``uint8`` tensors under
their name and listed in the manifest's metadata. The DCP ``Metadata`` that ``dcp.load`` needs
is rebuilt from the manifest (tensor sizes, dtypes and chunks) plus a small JSON record in its
metadata (which names hold bytes, and DCP's planner data); nothing in the snapshot is pickled
by tsnap itself.

The writes go through tsnap's engine: on each save, ``write_data`` hands the items its rank
writes to a ``tsnap.Snapshotter`` (staging copy into pooled buffers, io_uring writes, per-chunk
hashes, commit). On several ranks every rank writes its own items into the one snapshot and
rank 0 commits it, through a ``tsnap.DistGroup`` over the ``torch.distributed`` store: tsnap
runs no collective on the training's process group.

What the adapter speeds up, and what it cannot:

* It speeds up the storage part: DCP's default writer runs ``torch.save`` per item and writes
  through Python file objects from one thread; tsnap writes aligned chunks with io_uring and
  O_DIRECT, hashes them on the way, and commits atomically (DCP's writer makes each file
  atomic, not the checkpoint).
* DCP's planner stays in front of it: the planning collectives (gather and scatter of the plans
  on the training's process group) and the per-item resolution run on every save, as with any
  DCP storage layer.
* DCP's stager stays in front of it too: ``dcp.async_save`` first copies the whole state with
  its own stager (the training's stall), then runs the save in a thread, where tsnap copies the
  staged tensors once more into its buffers. With tsnap's own API
  (``tsnap.Snapshotter(root, group=...).save_async(name, state)``) the one staging copy is the
  stall (pooled, reused buffers, faulted in once, parallel copy threads).
* ``StorageWriter(path, async_commit=True)`` makes a plain ``dcp.save`` return once tsnap has
  staged the state, with the write and commit going on in the background (``writer.wait()``);
  this is closer to tsnap's own behaviour, without DCP's second copy.

Thread-safety: a writer or reader serves one save or load at a time. Writers on the same root
share one ``tsnap.Snapshotter`` per process (its staging buffers are reused by every save),
unless a ``snapshotter`` is given; those Snapshotters are closed (after their saves in flight
commit) at interpreter exit or by ``close_snapshotters()``.
"""

from __future__ import annotations

import atexit
import dataclasses
import io
import json
import os
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.checkpoint import storage as _dcp_storage
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.futures import Future

from . import _C, _api, _dist
from ._api import PathArg
from ._errors import ErrorCode, error
from ._tree import Tensors

__all__ = ["StorageReader", "StorageWriter", "close_snapshotters"]

# The manifest metadata key of the adapter's record (which names hold bytes, planner data).
DCP_KEY = "tsnap_dcp"
# The DCP metadata version this adapter writes (that of DCP's own filesystem writer).
_DCP_VERSION = "1.0.0"
_MANIFEST = "MANIFEST.json"

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_SUPPORTED = frozenset(_DTYPES.values())


def _error(code: ErrorCode, message: str) -> Exception:
    """The tsnap.Error of ``code`` (its class follows from the code), with the adapter's
    prefix."""
    return error(code, f"tsnap.dcp: {message}")


def _invalid(message: str, code: ErrorCode = "invalid_argument") -> Exception:
    return _error(code, message)


def _fspath(path: PathArg) -> str:
    return os.path.abspath(os.fsdecode(os.fspath(path)))


def _split(path: PathArg) -> tuple[str, str]:
    path = _fspath(path).rstrip(os.sep)
    root, name = os.path.split(path)
    if not name or not root:
        raise _invalid(f"'{path}' cannot be a snapshot path: it needs a parent directory")
    return root, name


def _dist_world() -> tuple[int, int]:
    """(rank, world size) of the default torch.distributed group, (0, 1) without one."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# ---------------------------------------------------------------------------------------------
# Shared Snapshotters and the default group.

_lock = threading.Lock()
_snapshotters: dict[tuple[Any, ...], _api.Snapshotter] = {}
_default_group: _dist.DistGroup | None = None


def _default_dist_group(world_size: int) -> _dist.DistGroup:
    """The process's tsnap.DistGroup over the default torch.distributed group's store."""
    global _default_group
    _, world = _dist_world()
    if world != world_size:
        raise _invalid(
            f"DCP saves on {world_size} ranks but the default process group has {world}: "
            "with a process_group other than the default one, pass "
            "StorageWriter(..., group=tsnap.DistGroup(...)) for the same ranks")
    with _lock:
        if _default_group is None:
            # A fixed prefix: the group may be made on DCP's background thread, in an order
            # with the user's own groups that differs between ranks.
            _default_group = _dist.DistGroup(prefix="tsnap/dcp")
        return _default_group


def _shared_snapshotter(root: str, group: _dist.DistGroup | None,
                        options: dict[str, Any]) -> _api.Snapshotter:
    key = (root, id(group) if group is not None else None, tuple(sorted(options.items())))
    with _lock:
        snap = _snapshotters.get(key)
        if snap is None:
            kwargs = dict(options)
            if group is not None:
                kwargs["group"] = group
            snap = _api.Snapshotter(root, **kwargs)
            _snapshotters[key] = snap
        return snap


def close_snapshotters() -> None:
    """Closes the Snapshotters that the writers of this process share (each waits for its saves
    in flight to commit or fail, then frees its staging buffers). A later save makes new ones."""
    with _lock:
        snaps = list(_snapshotters.values())
        _snapshotters.clear()
    for snap in snaps:
        snap.close()


atexit.register(close_snapshotters)


# ---------------------------------------------------------------------------------------------
# The writer.

@dataclasses.dataclass(frozen=True)
class _PlanData:
    """What the coordinator tells every rank in its plan's storage_data."""
    world_size: int
    record: str  # the JSON of the adapter's record, for the manifest metadata


def _record_of(plans: Sequence[SavePlan]) -> str:
    """The adapter's manifest record from the global plan: bytes names and planner data."""
    byte_names = sorted({it.index.fqn for p in plans for it in p.items
                         if it.type == WriteItemType.BYTE_IO})
    mappings: dict[Any, Any] = {}
    for p in plans:
        if isinstance(p.planner_data, dict):
            mappings.update(p.planner_data)
    planner_data: dict[str, list[str | int]] = {}
    plain = True
    for fqn, path in mappings.items():
        if not isinstance(fqn, str) or not isinstance(path, (tuple, list)) or not all(
                isinstance(x, (str, int)) and not isinstance(x, bool) for x in path):
            plain = False  # a custom planner's data: not kept
            break
        planner_data[fqn] = list(path)
    return json.dumps({"version": _DCP_VERSION, "bytes": byte_names,
                       "planner_data": planner_data if plain else None})


class StorageWriter(_dcp_storage.StorageWriter):
    """A DCP ``StorageWriter`` that writes a tsnap snapshot at ``path``.

    ``dcp.save(state_dict, storage_writer=tsnap.dcp.StorageWriter(path))`` writes the snapshot
    ``path`` (``<root>/<name>``, root = its parent directory) and returns once it is committed;
    ``dcp.async_save`` the same in DCP's background thread. A ``checkpoint_id`` given to
    ``dcp.save`` replaces ``path``.

    Arguments:
        path: the snapshot directory to write.
        overwrite: replace an existing snapshot at ``path`` (atomically: the old one stays
            whole until the new one commits). True by default, like DCP's ``FileSystemWriter``;
            False makes an existing snapshot an error. A path that holds anything else than a
            tsnap snapshot or an empty directory is always an error.
        async_commit: make ``write_data`` (and so a plain ``dcp.save``) return once tsnap has
            staged the state, with writes and commit in the background; ``wait()`` blocks until
            committed and raises the save's error. Off by default (DCP's contract: the
            checkpoint is complete when ``save`` returns).
        snapshotter: a ``tsnap.Snapshotter`` to save with; its root must be the parent of
            ``path`` (and, on several ranks, it must have a ``group``). Default: a Snapshotter
            shared by the writers of this process on the same root, made with
            ``snapshotter_options`` (keyword arguments of ``tsnap.Snapshotter``).
        group: on several ranks, the ``tsnap.DistGroup`` of the ranks of the save. Default: one
            made once per process over the default ``torch.distributed`` group's store.
        dtype: store floating tensors in this dtype (e.g. ``torch.bfloat16``); ``dcp.load``
            converts back into the destination's dtype. Default: as they are.

    Errors: ``tsnap.Error`` subclasses (wrapped by DCP in a ``CheckpointException`` naming the
    rank): ``InvalidArgument`` for a dtype the format does not hold (complex, float8) or a bad
    path, ``Error`` when the snapshot exists and ``overwrite`` is False, ``IoError`` for failed
    writes.
    """

    def __init__(self, path: PathArg, *, overwrite: bool = True, async_commit: bool = False,
                 snapshotter: _api.Snapshotter | None = None,
                 group: _dist.DistGroup | None = None, dtype: torch.dtype | None = None,
                 **snapshotter_options: Any) -> None:
        super().__init__()
        self._path = _fspath(path)
        self._overwrite = bool(overwrite)
        self._async_commit = bool(async_commit)
        self._snapshotter = snapshotter
        self._group = group
        self._dtype = dtype
        self._options = snapshotter_options
        if snapshotter is not None and snapshotter_options:
            raise _invalid("pass either a snapshotter or Snapshotter options, not both")
        self._save_id = str(uuid.uuid4())
        self._handle: _api.SaveHandle | None = None

    # -- DCP's protocol ------------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self._path = _fspath(checkpoint_id)
        self._save_id = str(uuid.uuid4())

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("use_collectives", True) and _dist_world()[1] > 1:
            raise _invalid("use_collectives=False is not supported: the ranks of a save write "
                           "one snapshot together")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # Found before anything is staged: a path that holds something else than a snapshot
        # (a checkpoint of DCP's own writer, a user's files), which an overwrite would replace.
        if os.path.lexists(self._path) and not (
                os.path.isdir(self._path) and (not os.listdir(self._path) or os.path.isfile(
                    os.path.join(self._path, _MANIFEST)))):
            raise _error("already_exists", f"{self._path} exists and is not a tsnap snapshot: "
                         "remove it or save elsewhere")
        # And a dtype the format cannot hold.
        for item in plan.items:
            if item.tensor_data is not None:
                dtype = item.tensor_data.properties.dtype
                if dtype not in _SUPPORTED:
                    raise _invalid(f"'{item.index.fqn}' is a {dtype} tensor, which a tsnap "
                                   "snapshot cannot hold (float64/32/16, bfloat16, int64/32/16/8,"
                                   " uint8 and bool)")
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        if all(not p.usable for p in plans):
            return plans  # DCP's plan cache: every rank reuses its previous plan
        record = _record_of(plans)
        out = []
        empty_written = set()
        for p in plans:
            if p.usable:
                # Empty chunks hold nothing: they are not written (an uneven sharding gives
                # some ranks none), except one for a tensor that is empty as a whole.
                items = []
                for it in p.items:
                    if it.tensor_data is not None and _numel(it.tensor_data.chunk.sizes) == 0:
                        fqn = it.index.fqn
                        if _numel(it.tensor_data.size) != 0 or fqn in empty_written:
                            continue
                        empty_written.add(fqn)
                    items.append(it)
                # Every rank gets the record: the group's rank 0, whichever it is, commits it.
                p = dataclasses.replace(p, items=items,
                                        storage_data=_PlanData(len(plans), record))
            out.append(p)
        return out

    def write_data(self, plan: SavePlan,
                   planner: SavePlanner) -> Future[list[_dcp_storage.WriteResult]]:
        data = plan.storage_data
        if not isinstance(data, _PlanData):
            raise _invalid("the plan was not prepared by tsnap.dcp.StorageWriter "
                           "(prepare_global_plan)")
        distributed = data.world_size > 1
        snap, name = self._snapshotter_for(data.world_size)
        try:
            entries, shards, results = self._items(plan, planner, distributed)
        except BaseException as e:
            # The other ranks' saves fail now, naming this rank's error, not on the timeout.
            snap.abandon(name, f"{type(e).__name__}: {e}")
            raise
        metadata = {DCP_KEY: json.loads(data.record)}
        self._handle = _save_pieces(snap, name, entries, shards, metadata, self._dtype,
                                    self._overwrite)
        if not self._async_commit:
            self._handle.wait()
        fut: Future[list[_dcp_storage.WriteResult]] = Future()
        fut.set_result(results)
        return fut

    @staticmethod
    def _items(plan: SavePlan, planner: SavePlanner, distributed: bool
               ) -> tuple[Tensors, _dist.Shards, list[_dcp_storage.WriteResult]]:
        """What this rank saves of `plan`: (entries, shards, DCP write results)."""
        entries: Tensors = {}
        shards: _dist.Shards = {}
        results: list[_dcp_storage.WriteResult] = []
        for item in plan.items:
            key = item.index.fqn
            if key in entries:
                raise _invalid(f"this rank writes '{key}' twice (several local chunks of one "
                               "tensor are not supported)")
            value = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                tensor = _bytes_tensor(value)
                shape = list(tensor.shape)
                spec = (shape, [0]) if distributed else None
            else:
                if not isinstance(value, torch.Tensor) or item.tensor_data is None:
                    raise _invalid(f"'{key}': a tensor write item resolved to a "
                                   f"{type(value).__name__}, not a tensor")
                tensor = value.detach()
                chunk = item.tensor_data.chunk
                size = list(item.tensor_data.size)
                offsets = list(chunk.offsets)
                if list(tensor.shape) != list(chunk.sizes):
                    raise _invalid(f"'{key}': the planner resolved a tensor of shape "
                                   f"{list(tensor.shape)} for a chunk of {list(chunk.sizes)}")
                whole = offsets == [0] * len(size) and list(chunk.sizes) == size
                spec = None if whole and not distributed else (size, offsets)
            entries[key] = tensor
            if spec is not None:
                shards[key] = spec
            results.append(_dcp_storage.WriteResult(
                index=item.index, size_in_bytes=tensor.numel() * tensor.element_size(),
                storage_data=key))
        return entries, shards, results

    def finish(self, metadata: Metadata, results: list[list[_dcp_storage.WriteResult]]) -> None:
        # The manifest, written by tsnap's commit, is the checkpoint's metadata.
        pass

    def storage_meta(self) -> StorageMeta:
        return StorageMeta(checkpoint_id=self._path, save_id=self._save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            _split(checkpoint_id)
        except Exception:
            return False
        return True

    # -- tsnap's side --------------------------------------------------------------------------

    @property
    def checkpoint_id(self) -> str:
        """The snapshot directory this writer writes."""
        return self._path

    @property
    def handle(self) -> _api.SaveHandle | None:
        """The ``tsnap.SaveHandle`` of the last save (None before the first)."""
        return self._handle

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until the last save is committed (``async_commit``); raises its error.
        Returns False on timeout, True otherwise (also when nothing was saved)."""
        return True if self._handle is None else self._handle.wait(timeout)

    def _snapshotter_for(self, world_size: int) -> tuple[_api.Snapshotter, str]:
        root, name = _split(self._path)
        if self._snapshotter is not None:
            if os.path.realpath(self._snapshotter.root) != os.path.realpath(root):
                raise _invalid(f"the snapshotter's root is {self._snapshotter.root} but the "
                               f"snapshot {self._path} is under {root}")
            group = getattr(self._snapshotter, "group", None)
            ranks = 1 if group is None else group.world_size
            if ranks != world_size:
                raise _invalid(f"DCP saves on {world_size} ranks but the snapshotter's group has "
                               f"{ranks}")
            return self._snapshotter, name
        group = None
        if world_size > 1:
            group = self._group if self._group is not None else _default_dist_group(world_size)
            if group.world_size != world_size:
                raise _invalid(f"DCP saves on {world_size} ranks but the group has "
                               f"{group.world_size}")
        elif self._group is not None:
            raise _invalid("a group was given but DCP saves on one rank")
        return _shared_snapshotter(root, group, self._options), name

    def __getstate__(self) -> dict[str, Any]:
        # DCP's process-based async executor sends the writer to another process: the
        # Snapshotter and the handle stay here (the other process makes its own).
        state = self.__dict__.copy()
        state["_snapshotter"] = None
        state["_handle"] = None
        state["_group"] = None
        return state


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _bytes_tensor(value: object) -> torch.Tensor:
    if not isinstance(value, io.BytesIO):
        raise _invalid(f"a bytes write item resolved to a {type(value).__name__}, not BytesIO")
    raw = value.getvalue()
    if not raw:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _save_pieces(snap: _api.Snapshotter, name: str, entries: Tensors, shards: _dist.Shards,
                 metadata: dict[str, Any], dtype: torch.dtype | None,
                 overwrite: bool) -> _api.SaveHandle:
    """Starts saving ``entries`` ({key: tensor}), the keys of ``shards`` as pieces ({key:
    (global_shape, offsets)}); returns the tsnap.SaveHandle once every tensor is staged."""
    # The keys are flat (DCP's names), so no structure record: tsnap.load returns them flat.
    # (On several ranks each rank holds only its own keys, and rank 0's metadata is the one
    # committed: a structure record would name rank 0's keys alone.)
    return _api.SaveHandle(snap._s.save_async(name, entries, json.dumps(metadata), dtype,
                                              "eager", bool(overwrite), 0, 0, None,
                                              shards=shards))


# ---------------------------------------------------------------------------------------------
# The reader.

def _read_manifest(path: str) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any], str]:
    """The manifest's tensors and metadata: ``({key: [record, ...]}, metadata, id)``.

    tsnap validates the manifest first (a missing or corrupt one raises tsnap.IoError or
    tsnap.FormatError); the records are then read from the same, validated text.
    """
    meta_text = _C.metadata(path)  # validates MANIFEST.json
    with open(os.path.join(path, _MANIFEST), "rb") as f:
        manifest = json.loads(f.read())
    meta = json.loads(meta_text)
    if manifest.get("metadata") != meta:
        raise _error("busy", f"the snapshot {path} changed while it was read; load again")
    tensors = {}
    for key, rec in manifest["tensors"].items():
        tensors[key] = rec["pieces"] if "pieces" in rec else [rec]
    return tensors, meta, manifest.get("id", "")


class StorageReader(_dcp_storage.StorageReader):
    """A DCP ``StorageReader`` that reads a tsnap snapshot at ``path``.

    ``dcp.load(state_dict, storage_reader=tsnap.dcp.StorageReader(path))`` loads a snapshot
    that ``StorageWriter`` wrote (on any number of ranks) into ``state_dict``, on any number of
    ranks and with any sharding: each rank reads only the chunks of the shard files that hold
    the parts it needs, checks each chunk's hash, and converts floating dtypes into its
    destinations' dtypes. A snapshot written by tsnap's own API loads too: its keys join a
    nested state's path with ``/`` (``extra/uneven``) where DCP flattens with ``.``
    (``extra.uneven``), so each such key is also served under its dotted name (unless another
    key has that name); non-tensor values of such snapshots are not served.

    Arguments:
        path: the snapshot directory (a ``checkpoint_id`` given to ``dcp.load`` replaces it).
        verify: check every chunk read against its XXH3-64 (default True).

    Errors (wrapped by DCP in a ``CheckpointException``): ``tsnap.IoError`` for a missing
    snapshot or shard, ``tsnap.FormatError`` for a corrupt one (a hash mismatch names the file
    and chunk).
    """

    def __init__(self, path: PathArg, *, verify: bool = True) -> None:
        super().__init__()
        self._path = _fspath(path)
        self._verify = bool(verify)
        self._load_id = str(uuid.uuid4())
        self._records: dict[str, list[dict[str, Any]]] | None = None
        self._aliases: dict[str, str] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self._path = _fspath(checkpoint_id)
        self._load_id = str(uuid.uuid4())
        self._records = None

    # No **kwargs: DCP then does not retry with per-rank metadata files, which tsnap has not.
    def read_metadata(self, *args: Any) -> Metadata:
        tensors, meta, snapshot_id = _read_manifest(self._path)
        record = meta.get(DCP_KEY) or {}
        byte_names = set(record.get("bytes", ()))
        state_dict_metadata: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
        storage_data: dict[MetadataIndex, str] = {}
        for key, pieces in tensors.items():
            if key in byte_names:
                state_dict_metadata[key] = BytesStorageMetadata()
                storage_data[MetadataIndex(key)] = key
                continue
            first = pieces[0]
            shard = first.get("shard")
            size = shard["global_shape"] if shard else first["shape"]
            chunks = []
            for rec in pieces:
                offsets = rec["shard"]["offsets"] if rec.get("shard") else [0] * len(size)
                chunks.append(ChunkStorageMetadata(offsets=torch.Size(offsets),
                                                   sizes=torch.Size(rec["shape"])))
                storage_data[MetadataIndex(key, offsets)] = key
            dtype = _DTYPES.get(first.get("source_dtype", first["dtype"]), _DTYPES[first["dtype"]])
            state_dict_metadata[key] = TensorStorageMetadata(
                properties=TensorProperties(dtype=dtype), size=torch.Size(size), chunks=chunks)
        planner_data = record.get("planner_data")
        if planner_data is not None:
            planner_data = {k: tuple(v) for k, v in planner_data.items()}
        if not record:
            # tsnap's own keys join a nested path with "/", DCP's with ".": serve each under its
            # dotted name too, so that dcp.load of a nested state finds it.
            self._aliases = {}
            dotted: dict[str, int] = {}
            for key in tensors:
                dotted[key.replace("/", ".")] = dotted.get(key.replace("/", "."), 0) + 1
            for key in list(state_dict_metadata):
                alias = key.replace("/", ".")
                if alias == key or alias in tensors or dotted[alias] > 1:
                    continue
                self._aliases[alias] = key
                state_dict_metadata[alias] = state_dict_metadata[key]
                for index, stored in list(storage_data.items()):
                    if stored == key:
                        storage_data[MetadataIndex(alias, index.offset)] = key
        self._records = tensors
        return Metadata(
            state_dict_metadata=state_dict_metadata, planner_data=planner_data,
            storage_data=storage_data,
            storage_meta=StorageMeta(checkpoint_id=self._path, save_id=snapshot_id,
                                     load_id=self._load_id),
            version=record.get("version", _DCP_VERSION))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if self._records is None:
            self._records = _read_manifest(self._path)[0]

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        self._read_bytes([r for r in plan.items if r.type == LoadItemType.BYTE_IO], planner)
        self._read_tensors([r for r in plan.items if r.type != LoadItemType.BYTE_IO], planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @property
    def checkpoint_id(self) -> str:
        """The snapshot directory this reader reads."""
        return self._path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            return os.path.isfile(os.path.join(_fspath(checkpoint_id), _MANIFEST))
        except Exception:
            return False

    # -- reads ---------------------------------------------------------------------------------

    def _stored(self, fqn: str) -> str:
        """The snapshot's key that DCP's name ``fqn`` stands for (itself, or a dotted alias)."""
        return self._aliases.get(fqn, fqn)

    def _pieces(self, key: str) -> list[dict[str, Any]]:
        if self._records is None:
            self._records = _read_manifest(self._path)[0]
        key = self._stored(key)
        try:
            return self._records[key]
        except KeyError:
            raise _invalid(f"'{key}' is not in the snapshot {self._path}",
                           "key_not_found") from None

    def _read_bytes(self, items: list[ReadItem], planner: LoadPlanner) -> None:
        buffers: dict[str, tuple[torch.Tensor, Any]] = {}
        for req in items:
            key = req.storage_index.fqn
            if key not in buffers:
                rec = self._pieces(key)[0]
                buffers[key] = (torch.empty(rec["shape"], dtype=_DTYPES[rec["dtype"]]), None)
        if buffers:
            _load_boxes(self._path, buffers, self._verify)
        for req in items:
            raw = buffers[req.storage_index.fqn][0].numpy().tobytes()
            planner.load_bytes(req, io.BytesIO(raw))

    def _read_tensors(self, items: list[ReadItem], planner: LoadPlanner) -> None:
        # One load per round; a round reads at most one box of each key (tsnap's loads take
        # one destination per key), so a key read as k boxes takes k rounds.
        rounds: list[list[ReadItem]] = []
        seen: dict[str, int] = {}
        for req in items:
            i = seen.get(req.storage_index.fqn, 0)
            seen[req.storage_index.fqn] = i + 1
            if i == len(rounds):
                rounds.append([])
            rounds[i].append(req)
        for batch in rounds:
            dests: dict[str, tuple[torch.Tensor, tuple[list[int], list[int]] | None]] = {}
            after = []
            for req in batch:
                key = self._stored(req.storage_index.fqn)
                pieces = self._pieces(key)
                rec = _piece_at(pieces, req.storage_index.offset, key)
                stored = _DTYPES[rec["dtype"]]
                global_shape = rec["shard"]["global_shape"] if rec.get("shard") else rec["shape"]
                base = rec["shard"]["offsets"] if rec.get("shard") else [0] * len(global_shape)
                box = [b + o for b, o in zip(base, req.storage_offsets)]
                lengths = list(req.lengths)
                target = planner.resolve_tensor(req).detach()
                if list(target.shape) != lengths:
                    raise _invalid(f"'{key}': the planner resolved a tensor of shape "
                                   f"{list(target.shape)} for a read of {lengths}")
                direct = (target.device.type == "cpu" and target.is_contiguous()
                          and (target.dtype == stored
                               or (target.dtype.is_floating_point and stored.is_floating_point)))
                dest = target if direct else torch.empty(lengths, dtype=stored)
                whole = box == [0] * len(box) and lengths == list(global_shape)
                dests[key] = (dest, None if whole else (list(global_shape), box))
                after.append((req, target, dest, direct))
            _load_boxes(self._path, dests, self._verify)
            for req, target, dest, direct in after:
                if not direct:
                    target.copy_(dest)
                planner.commit_tensor(req, target)


def _piece_at(pieces: list[dict[str, Any]], offset: Sequence[int] | None,
              key: str) -> dict[str, Any]:
    if offset is None or len(pieces) == 1:
        return pieces[0]
    want = list(offset)
    for rec in pieces:
        if rec.get("shard") and rec["shard"]["offsets"] == want:
            return rec
    raise _invalid(f"'{key}' has no stored piece at offsets {want}", "key_not_found")


def _load_boxes(path: str,
                dests: dict[str, tuple[torch.Tensor, tuple[list[int], list[int]] | None]],
                verify: bool) -> None:
    """Reads into ``dests`` ({key: (tensor, None or (global_shape, offsets))}), in place: each
    tensor receives its box of the stored global tensor, from whichever pieces overlap it."""
    tensors = {k: t for k, (t, _) in dests.items()}
    shards = {k: spec for k, (_, spec) in dests.items() if spec is not None}
    _C.load_into(path, tensors, [], [], bool(verify), "", False, False, False, shards=shards)
