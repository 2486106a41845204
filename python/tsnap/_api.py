"""The Python API over tsnap._C: Snapshotter, SaveHandle, save, load, load_into, latest, verify,
reserve_staging."""

from __future__ import annotations

import atexit
import json
import os
import sys
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Optional, Union

import torch

from . import _C, _dist
from ._errors import error
from ._tree import TREE_KEY, State, Tensors, flatten, unflatten

# A path as os.fspath takes it.
PathArg = Union[str, bytes, os.PathLike[str], os.PathLike[bytes]]
# Glob patterns on flat keys: one, several, or None for all.
Patterns = Optional[Union[str, Sequence[str]]]
DtypeRules = Optional[Mapping[str, Optional[torch.dtype]]]
Staging = Literal["eager", "lazy"]
Engine = Literal["auto", "io_uring", "pwrite"]
# The C++ InFlightPolicy: kWait, kFailFast ('fail': the deprecated spelling of 'fail_fast').
InFlight = Literal["wait", "fail_fast"]

# The metadata key of the C++ checkpoint's own record (tsnap::kCheckpointInfoKey).
_CHECKPOINT_INFO_KEY = "tsnap"


def _fspath(path: PathArg) -> str:
    return os.fsdecode(os.fspath(path))


def _saved_metadata(state: State,
                    metadata: Mapping[str, Any] | None) -> tuple[Tensors, str]:
    """The flat tensors of ``state`` and the manifest metadata: the user's plus the structure."""
    tensors, tree = flatten(state)
    meta = {} if metadata is None else dict(metadata)
    for reserved in (TREE_KEY, _CHECKPOINT_INFO_KEY):
        if reserved in meta:
            raise ValueError(f"tsnap: metadata key '{reserved}' is reserved")
    meta[TREE_KEY] = tree
    try:
        text = json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"tsnap: metadata must be JSON-serialisable: {e}") from None
    return tensors, text


def _dtype_arg(dtype: torch.dtype | None, dtype_rules: DtypeRules) -> _C.DtypeArg:
    """``dtype`` with its per-key rules, as the binding takes them."""
    if not dtype_rules:
        return dtype
    if not isinstance(dtype_rules, Mapping):
        raise TypeError("tsnap: dtype_rules must be a dict of glob pattern -> torch.dtype or None, "
                        f"not {type(dtype_rules).__name__}")
    return (dtype, [(str(k), v) for k, v in dtype_rules.items()])


def _in_flight(when_busy: str) -> bool:
    """Whether ``when_busy`` (a Snapshotter's) fails fast; 'fail' is the deprecated spelling."""
    if when_busy == "fail":
        warnings.warn("tsnap: when_busy='fail' is deprecated, use 'fail_fast'",
                      DeprecationWarning, stacklevel=3)
        return True
    if when_busy not in ("wait", "fail_fast"):
        raise error("invalid_argument",
                    f"tsnap: when_busy must be 'wait' or 'fail_fast', not {when_busy!r}")
    return when_busy == "fail_fast"


def _user_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k not in (TREE_KEY, _CHECKPOINT_INFO_KEY)}


class SaveHandle:
    """The future of one asynchronous save (``Snapshotter.save_async``).

    ``wait()`` blocks (GIL released) until the snapshot is committed and raises the save's
    error (a ``tsnap.Error`` carrying the C++ message); ``done()`` polls; ``wait_staged()``
    returns once the tensors may change (at once for eager staging); ``stats`` gives the
    figures (complete once done); ``path`` is the final snapshot directory. Dropping the handle
    does not cancel the save.
    """

    __slots__ = ("_h",)

    def __init__(self, handle: _C.SaveHandle) -> None:
        self._h = handle

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until committed; with ``timeout`` (seconds), at most that long.

        Returns True when the save completed, False on timeout; raises its error.
        """
        return self._h.wait(-1.0 if timeout is None else max(0.0, float(timeout)))

    def done(self) -> bool:
        """True once committed or failed."""
        return self._h.done()

    def wait_staged(self) -> None:
        """Blocks until every tensor is staged (lazy staging); raises a staging error."""
        self._h.wait_staged()

    @property
    def stats(self) -> _C.SaveStats:
        """A ``tsnap.SaveStats`` (stall_s, stage_s, write_s, commit_s, total_s, bytes, ...)."""
        return self._h.stats

    @property
    def path(self) -> str:
        return self._h.path

    def __repr__(self) -> str:
        return f"<tsnap.SaveHandle {self.path} {'done' if self.done() else 'in flight'}>"


class Snapshotter:
    """Takes asynchronous snapshots under ``root`` (``<root>/<name>/``).

    Owns the staging buffers (allocated once, reused by every save; ``staging_budget`` bytes,
    0 = sized at the first save to hold it whole, at most a quarter of RAM), the copy threads
    and the io_uring writer. ``close()`` (or leaving a ``with`` block, or garbage collection)
    waits for every save in flight to commit or fail.

    Arguments mirror ``tsnap::SnapshotterOptions``, flat (``stage_threads`` is
    ``staging.threads``, ``staging_budget`` ``staging.budget_bytes``, ``keep_hot``
    ``staging.keep_hot``; ``io_threads``, ``queue_depth``, ``engine`` and ``direct_io`` are
    ``io.*``; ``durable_root``, ``drain_bytes_per_second``, ``local_keep_last`` and
    ``node_local`` are ``tier.*``): ``chunk_bytes`` (multiple of 4096),
    ``stage_threads`` (0 = every core for eager staging, half for lazy), ``io_threads``,
    ``queue_depth``, ``engine`` ('auto', 'io_uring', 'pwrite'), ``direct_io``,
    ``max_in_flight`` (saves writing at once), ``when_busy`` (``InFlightPolicy``: 'wait', a save
    beyond max_in_flight waits; 'fail_fast', it raises tsnap.Error, code 'busy'),
    ``incremental`` (write only the chunks that differ from the previous snapshot; unchanged
    shard files become hard links), ``keep_hot`` (keep the last snapshot's bytes in memory for
    ``load_hot()``), ``durable_root`` (a second, slower directory that a background drain copies
    each committed snapshot to, at most ``drain_bytes_per_second``, keeping the newest
    ``local_keep_last`` under ``root``).

    ``group`` (a ``tsnap.DistGroup``) makes every save a distributed one: each rank of the
    group makes a Snapshotter on the same root (a filesystem they share) and calls
    ``save_async`` with the same names in the same order; each writes its pieces of DTensors
    and its share of the replicated tensors, rank 0 commits, and every rank's handle completes
    with the same outcome. With ``node_local=True`` (and a ``durable_root``) ``root`` is a
    disk of each node instead: every node keeps its ranks' files, every rank drains its node's
    share to ``durable_root``, and the snapshot is whole there once the last share is in.

    ``agent`` (the socket of a ``tsnap agent --socket PATH`` on this node) hands every save to
    that snapshot agent once it is staged: a save whose ``save_async`` returned is committed
    even if this process is killed, and a process restarted on the same root resumes from the
    agent's memory (``load_hot()``) without reading the disk. Saves through an agent are full
    ones (``incremental`` is ignored) and ``keep_hot`` is on. When the agent is unreachable or
    goes away, saves raise ``tsnap.Error`` naming the socket, or with ``agent_fall_back=True``
    go on in this process without that guarantee.
    """

    def __init__(self, root: PathArg, staging_budget: int = 0, *, chunk_bytes: int = 16 << 20,
                 stage_threads: int = 0, io_threads: int = 4, queue_depth: int = 32,
                 engine: Engine = "auto", direct_io: bool = True, max_in_flight: int = 2,
                 when_busy: InFlight = "wait", incremental: bool = False, keep_hot: bool = False,
                 durable_root: PathArg | None = None, drain_bytes_per_second: int = 0,
                 local_keep_last: int = 2, group: _dist.DistGroup | None = None,
                 node_local: bool = False, agent: PathArg | None = None,
                 agent_fall_back: bool = False) -> None:
        fail_fast = _in_flight(when_busy)
        self._s = _C.Snapshotter(
            root=_fspath(root), staging_budget=int(staging_budget), chunk_bytes=int(chunk_bytes),
            stage_threads=int(stage_threads), io_threads=int(io_threads),
            queue_depth=int(queue_depth), engine=engine, direct_io=bool(direct_io),
            max_in_flight=int(max_in_flight), fail_fast=fail_fast, incremental=bool(incremental),
            keep_hot=bool(keep_hot),
            durable_root=_fspath(durable_root) if durable_root is not None else "",
            drain_bytes_per_second=int(drain_bytes_per_second),
            local_keep_last=int(local_keep_last), group=_group_of(group),
            node_local=bool(node_local), agent=_fspath(agent) if agent is not None else "",
            agent_fall_back=bool(agent_fall_back))
        self._group = group
        self._layouts: _dist.Layouts = {}  # the DTensor layouts of its saves (_dist.to_pieces)
        _open_snapshotters.add(self)

    def save_async(self, name: str, state: State, metadata: Mapping[str, Any] | None = None,
                   dtype: torch.dtype | None = None, staging: Staging = "eager", *,
                   overwrite: bool = False, num_shards: int = 0, chunk_bytes: int = 0,
                   incremental: bool | None = None, dtype_rules: DtypeRules = None,
                   step: int | None = None, must_change: Iterable[str] = (),
                   fail_if_stale: bool = False) -> SaveHandle:
        """Starts saving ``state`` (a dict, possibly nested) as ``<root>/<name>``.

        Returns a SaveHandle once every tensor is copied into staging buffers (``staging=
        'eager'``: the tensors may change from then on), or at once (``'lazy'``: call
        ``handle.wait_staged()`` before the tensors next change, e.g. before
        ``optimizer.step()``). ``dtype`` (e.g. ``torch.bfloat16``) stores weights and moments
        in that precision; counters and scalars keep their dtype (0-d tensors such as Adam's
        ``step``, keys ending in ``step``), and so do integer and bool tensors.
        ``dtype_rules`` refines it per key, first match wins: ``{"*/exp_avg_sq":
        torch.float32}`` keeps Adam's second moments in fp32 (keys as saved, e.g.
        ``optim/state/0/exp_avg_sq``; None keeps a key's dtype). ``metadata`` is a JSON-able dict
        stored in the manifest. ``incremental`` (None: the Snapshotter's) overrides the
        Snapshotter's default for this save. ``step`` (an int) is recorded in the manifest;
        every save counts the tensors identical to the previous snapshot of this Snapshotter
        (``handle.stats.unchanged_tensors``), and with ``must_change`` (globs, e.g.
        ``["*/exp_avg", "*/exp_avg_sq"]``) those of them that should have changed while the
        step advanced are listed in ``stats.stale`` (``fail_if_stale``: the save fails with
        tsnap.Error, code 'stale', and nothing is committed). Raises tsnap.Error for a bad
        name, an existing snapshot (unless ``overwrite``), or a save of the same name still in
        flight.
        """
        tensors, meta = _saved_metadata(state, metadata)
        tensors, shards = _dist.to_pieces(tensors, self._group, self._layouts)
        return SaveHandle(self._s.save_async(
            name=name, tensors=tensors, metadata=meta, dtype=_dtype_arg(dtype, dtype_rules),
            staging=staging, overwrite=bool(overwrite), num_shards=int(num_shards),
            chunk_bytes=int(chunk_bytes), incremental=incremental, shards=shards,
            step=None if step is None else int(step), must_change=[str(p) for p in must_change],
            fail_if_stale=bool(fail_if_stale)))

    def abandon(self, name: str, reason: str) -> None:
        """With a group: tells the other ranks this rank will not take part in its next save
        of ``name`` (building its state failed, say), so theirs fail at once with tsnap.Error
        (peer_failed) naming this rank and ``reason``, not after the group's timeout. Call it
        instead of that ``save_async``; later saves are not affected. Without a group it does
        nothing."""
        self._s.abandon(str(name), str(reason))

    def prepare(self, state: State, dtype: torch.dtype | None = None, *, num_shards: int = 0,
                chunk_bytes: int = 0, dtype_rules: DtypeRules = None) -> None:
        """Sizes the staging buffers for saves of ``state`` (as its first save would, with the
        automatic ``staging_budget``) and faults them in now, on every core, so that the first
        ``save_async`` stalls no longer than the later ones. Call it once, with the state complete
        (an optimizer makes its moments at its first step; ``PeriodicSnapshots`` prepares at its
        first ``after_step``); it reads only the layout of ``state``. A no-op
        once the buffers exist (a fixed budget, an earlier prepare or save)."""
        tensors, _ = _saved_metadata(state, None)
        tensors, shards = _dist.to_pieces(tensors, self._group, self._layouts)
        self._s.prepare(tensors, _dtype_arg(dtype, dtype_rules), int(num_shards),
                        int(chunk_bytes), shards)

    def load_hot(self, include: Patterns = None, exclude: Patterns = None, *,
                 flat: bool = False) -> State | None:
        """The last committed snapshot from memory (``keep_hot=True``), as ``load`` returns it
        (every chunk verified against its hash), or None when none is in memory (keep_hot off,
        nothing saved yet, or evicted by a later save that needed the buffers)."""
        got = self._s.load_hot(_patterns(include), _patterns(exclude))
        if got is None:
            return None
        _, meta_text, tensors = got
        meta = json.loads(meta_text)
        if flat or TREE_KEY not in meta:
            return tensors
        return unflatten(meta[TREE_KEY], tensors, complete=include is None and exclude is None)

    def drain_wait(self) -> None:
        """With ``durable_root``: waits until every committed snapshot is in the durable tier;
        raises the first drain failure not raised yet."""
        self._s.drain_wait()

    def wait_all(self) -> None:
        """Waits for every save in flight (each handle keeps its own error)."""
        self._s.wait_all()

    def close(self) -> None:
        """Waits for the saves in flight and frees the buffers and threads."""
        self._s.close()

    @property
    def root(self) -> str:
        return self._s.root

    @property
    def group(self) -> _dist.DistGroup | None:
        """The DistGroup of a distributed Snapshotter, else None."""
        return self._group

    @property
    def engine(self) -> str:
        """The write engine in use, e.g. 'io_uring+O_DIRECT'."""
        return self._s.engine

    @property
    def staging_budget(self) -> int:
        """The staging budget in bytes (0 before the first save when automatic)."""
        return self._s.staging_budget

    def latest(self) -> str | None:
        """The newest committed snapshot under the root (and the durable root), or None."""
        return self._s.latest()

    def __enter__(self) -> Snapshotter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# What is still open when the interpreter exits is closed by an exit handler, while Python still
# runs: the saves in flight commit (an exception that ends the program does not lose a save that
# save_async accepted), and no engine thread lets go of a tensor that Python owns after the
# interpreter began to shut down (CPython ends a thread that asks for the GIL then, and ending
# one inside the engine aborts the process). The hooks first: each holds its Snapshotter open.
_open_hooks: weakref.WeakSet[Any] = weakref.WeakSet()
_open_snapshotters: weakref.WeakSet[Snapshotter] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for group in (_open_hooks, _open_snapshotters):
        for obj in list(group):
            try:
                obj.close()
            except Exception as e:  # an exit handler that raised would hide the others
                print(f"tsnap: at exit, closing {type(obj).__name__}: {e}", file=sys.stderr)


def save(path: PathArg, state: State, metadata: Mapping[str, Any] | None = None,
         dtype: torch.dtype | None = None, *, overwrite: bool = False, num_shards: int = 0,
         dtype_rules: DtypeRules = None) -> _C.SaveStats:
    """Saves ``state`` to the snapshot directory ``path`` and returns once it is committed.

    Returns its SaveStats. Arguments as ``Snapshotter.save_async``.
    """
    tensors, meta = _saved_metadata(state, metadata)
    tensors, shards = _dist.to_pieces(tensors, None)
    return _C.save(_fspath(path), tensors, meta, _dtype_arg(dtype, dtype_rules), bool(overwrite),
                   int(num_shards), shards)


def _group_of(group: _dist.DistGroup | None) -> _C.DistGroup | None:
    if group is None:
        return None
    if not isinstance(group, _dist.DistGroup):
        raise TypeError(f"tsnap: group must be a tsnap.DistGroup, not {type(group).__name__}")
    return group._g


def _patterns(patterns: Patterns) -> list[str]:
    if patterns is None:
        return []
    return [patterns] if isinstance(patterns, str) else list(patterns)


def load(path: PathArg, include: Patterns = None, exclude: Patterns = None, *,
         verify: bool = True, flat: bool = False, allow_unmatched: bool = False) -> State:
    """Loads a snapshot into new CPU tensors (stored dtype, bit-identical to what was saved).

    Returns the state in the structure it was saved with (``flat=True``, or a snapshot written
    by the C++ API: ``{key: tensor}``). ``include`` / ``exclude`` are glob patterns (or one) on
    the flat keys (``"model/*"``); only the selected chunks are read, and the tensors left out
    are left out of the structure (plain values always come back). Raises tsnap.IoError for a
    missing snapshot or shard, tsnap.FormatError for a corrupt one (hash mismatch, truncation),
    tsnap.InvalidArgument for a pattern that matches nothing.
    """
    path = _fspath(path)
    meta = json.loads(_C.metadata(path))
    tensors = _C.load(path, _patterns(include), _patterns(exclude), bool(verify), "",
                      bool(allow_unmatched))
    if flat or TREE_KEY not in meta:
        return tensors
    return unflatten(meta[TREE_KEY], tensors, complete=include is None and exclude is None)


def load_into(path: PathArg, state: State, include: Patterns = None, exclude: Patterns = None,
              *, strict: bool = False, verify: bool = True, atomic: bool = False,
              allow_unmatched: bool = False) -> dict[str, Any]:
    """Loads a snapshot into the existing tensors of ``state``, in place.

    ``state`` is nested like the saved one (``{"model": model.state_dict()}``), or is a part of
    it, flattened the same way; its non-tensor values are not changed. Floating tensors convert
    to each destination's dtype (bf16 on disk into fp32 parameters). Destination keys the
    snapshot lacks, and wrong shapes or dtypes, raise tsnap.InvalidArgument before anything is
    written; with ``strict``, so do snapshot keys (selected by include/exclude) that the
    destination lacks. ``atomic`` reads and verifies everything before writing anything.
    Returns a dict: loaded, not_in_destination, bytes_read, engine, seconds.

    ``DTensor`` values (``get_state_dict(model, optimizer)`` of an FSDP2 or tensor-parallel
    model, ``distribute_tensor``) receive this rank's region of the saved global tensor,
    whatever mesh, placements and world size saved it (or a single process): only the chunks
    that overlap it are read. GPU destinations are read and verified into pinned host memory
    and copied in on a side stream (ordered after the current stream; done when this returns,
    and only once every read has succeeded); non-contiguous ones go through a contiguous buffer
    on their device.
    """
    tensors, _ = flatten(state)
    tensors, shards, copy_back = _dist.to_destinations(tensors)
    report = _C.load_into(_fspath(path), tensors, _patterns(include), _patterns(exclude),
                          bool(verify), "", bool(allow_unmatched), bool(strict), bool(atomic),
                          shards)
    _dist.finish_destinations(copy_back)
    return report


def metadata(path: PathArg) -> dict[str, Any]:
    """The user metadata a snapshot was saved with (a dict; the periodic hook adds "step")."""
    return _user_metadata(json.loads(_C.metadata(_fspath(path))))


def latest(root: PathArg) -> str | None:
    """The newest committed snapshot under ``root`` (highest "step" metadata, then newest), or
    None; temporaries and snapshots without a valid manifest are skipped."""
    return _C.latest(_fspath(root))


def reserve_staging(nbytes: int, *, wait: bool = False) -> None:
    """Reserves ``nbytes`` of staging memory for the next staging pool made in this process and
    faults it in on a background thread (on the caller with ``wait``).

    The pool of a ``Snapshotter`` with the automatic budget is made by its first save (or
    ``prepare``), whose stall then includes faulting in fresh pages. Code that knows the
    state's size before it knows where it will save (a trainer plugin, after the first
    optimizer step) reserves it here; the next pool takes the reservation, resized to what it
    needs, and keeps the pages faulted in so far. Size it as the pool: the state's stored bytes
    plus a chunk per I/O thread, twice with ``keep_hot``. One reservation per process: a new
    one replaces the last; 0 releases it. Raises tsnap.IoError when the memory cannot be mapped.
    """
    if int(nbytes) < 0:
        raise error("invalid_argument", f"nbytes must be >= 0, not {nbytes}")
    _C.reserve_staging(int(nbytes), bool(wait))


def reserved_staging_bytes() -> int:
    """Bytes of staging memory reserved by ``reserve_staging`` and not yet taken by a pool."""
    return _C.reserved_staging_bytes()


def verify(path: PathArg) -> list[dict[str, Any]]:
    """Re-hashes every chunk; returns the bad ones (dicts: file, chunk, offset, problem), []
    when intact. Raises tsnap.Error when the snapshot has no valid manifest."""
    return _C.verify(_fspath(path))
