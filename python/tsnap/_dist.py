"""Saving and loading across ranks: ``DistGroup`` and the mapping of DTensors to tsnap's pieces.

A ``DTensor`` (``torch.distributed.tensor``; what ``get_state_dict`` returns for FSDP2 and
tensor-parallel models) is saved as its rank's *piece*: the local tensor with the global shape
and the offsets of its first element (the C++ ``tsnap::ShardSpec``). Where a mesh dimension
replicates the tensor, one replica writes each distinct piece. A DTensor replicated on a mesh
of the whole group, and every plain tensor, is a *replicated entry*: the C++ engine writes each
once across the ranks, balancing the bytes. A load into DTensors reads each rank's own region,
whatever mesh, placements or world size wrote the snapshot.
"""

from __future__ import annotations

import datetime
import itertools
import os
import sys
import zlib
from types import ModuleType
from typing import Any, Union

import torch

from . import _C
from ._errors import error
from ._tree import Tensors

# key -> (global shape, offsets) of a piece of a sharded tensor (the C++ tsnap::ShardSpec).
Shards = dict[str, tuple[list[int], list[int]]]
# Seconds, or a timedelta.
Timeout = Union[float, datetime.timedelta]

# How many DistGroups this process has made (their store prefixes: every rank makes its groups
# in the same order, as with torch.distributed.new_group).
_group_counter = itertools.count()


def _dist() -> ModuleType:
    import torch.distributed as dist
    if not dist.is_available():
        raise error("invalid_argument", "tsnap: this torch has no torch.distributed")
    return dist


class DistGroup:
    """The ranks that write one snapshot together, coordinated through a c10d ``Store``.

    Give one to ``Snapshotter(root, group=...)`` (or ``PeriodicSnapshots(..., group=...)``) on
    every rank: each rank's ``save_async`` then writes its part of one snapshot (its pieces of
    sharded tensors, its share of the replicated ones) and rank 0 commits it once every rank's
    files are durable; every rank's handle completes with the same outcome. The ranks agree
    through the store on tsnap's own threads: a save never runs a collective on the training's
    process group (Gloo or NCCL) and never blocks the training thread on the other ranks.

    ::

        dist.init_process_group("nccl")       # torchrun sets RANK, WORLD_SIZE, MASTER_*
        group = tsnap.DistGroup()             # the default group's store: no new rendezvous
        snap = tsnap.Snapshotter("/ckpt/run1", group=group)

    ``DistGroup()`` uses the store of the running default process group (after
    ``dist.init_process_group``) and its rank and world size; ``DistGroup(store, rank,
    world_size)`` a given ``torch.distributed.Store`` (TCPStore, FileStore, PrefixStore, ...);
    ``DistGroup.from_env()`` the torchrun environment. ``timeout`` (seconds): how long rank 0
    waits for the other ranks' parts of a save, and they for its verdict (twice that); a rank
    that is dead or stuck longer fails the save on every rank with a ``tsnap.Error`` naming it.
    ``prefix``: tsnap's keys in the store (default: one per group, counted in the order this
    process makes them, so make groups in the same order on every rank).

    Making a group blocks until rank 0 has joined (at most ``timeout``). Raises
    ``tsnap.InvalidArgument`` for a bad store, rank or world size, ``tsnap.Error`` when rank 0
    does not join in time. Thread-safe once made; share one group between Snapshotters.
    """

    def __init__(self, store: Any = None, rank: int | None = None,
                 world_size: int | None = None, *, timeout: Timeout = 300.0,
                 prefix: str | None = None) -> None:
        if store is None:
            dist = _dist()
            if not dist.is_initialized():
                raise error(
                    "invalid_argument",
                    "tsnap: DistGroup() takes the store of the default process group, and "
                    "torch.distributed is not initialized: call dist.init_process_group() first, "
                    "or use DistGroup.from_env() or DistGroup(store, rank, world_size)")
            store = dist.distributed_c10d._get_default_store()
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        elif rank is None or world_size is None:
            dist = _dist()
            if dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world_size = dist.get_world_size() if world_size is None else world_size
            else:
                raise error("invalid_argument", "tsnap: DistGroup(store, rank, world_size) needs "
                            "the rank and world size")
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if not timeout > 0:
            raise error("invalid_argument",
                        f"tsnap: DistGroup timeout must be positive, not {timeout}")
        if prefix is None:
            prefix = f"tsnap/g{next(_group_counter)}"
        self._store = store  # the Python object too: its type may hold more than the C++ store
        self._g = _C.DistGroup(store, int(rank), int(world_size), float(timeout), str(prefix))

    @classmethod
    def from_env(cls, *, timeout: Timeout = 300.0, prefix: str | None = None) -> DistGroup:
        """The group of a ``torchrun`` launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

        With torch.distributed initialized, that is its default group's store (as
        ``DistGroup()``). Otherwise it rendezvouses as ``init_process_group("env://")`` does:
        through torchrun's own store where torchrun hosts one, else rank 0 hosts a TCPStore on
        MASTER_ADDR:MASTER_PORT; then call ``init_process_group`` (if at all) with
        ``store=group.store``, since that port is taken. Raises ``tsnap.InvalidArgument``
        naming a missing variable.
        """
        dist = _dist()
        if dist.is_initialized():
            return cls(timeout=timeout, prefix=prefix)
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(name):
                raise error("invalid_argument",
                            f"tsnap: environment variable {name} is not set (set by torchrun)")
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        try:
            store, rank, world_size = next(dist.rendezvous(
                "env://", timeout=datetime.timedelta(seconds=float(seconds))))
        except (RuntimeError, ValueError) as e:
            raise error("peer_failed", f"tsnap: the torchrun rendezvous failed: {e}") from None
        return cls(store, rank, world_size, timeout=timeout, prefix=prefix)

    @property
    def rank(self) -> int:
        return self._g.rank

    @property
    def world_size(self) -> int:
        return self._g.world_size

    @property
    def store(self) -> Any:
        """The store (``init_process_group(store=...)`` can use it after ``from_env``)."""
        return self._store

    def __repr__(self) -> str:
        return f"<tsnap.DistGroup rank {self.rank} of {self.world_size}>"


def _dtensor_type() -> Any:
    """The DTensor class, or None while torch.distributed.tensor is not imported: then no
    DTensor exists, and a save or load of plain tensors does not pay for importing it (about
    a second, at the first call)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def _layout(key: str, dt: Any) -> tuple[Any, Any, Any]:
    """``(coordinate, local_shape, offsets)`` of this rank's piece of DTensor ``dt``;
    coordinate is None when this rank is not in its mesh. Raises for placements that are not
    one box of the global tensor (Partial, strided shards)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    for p in dt.placements:
        if p.is_partial():
            raise error(
                "invalid_argument",
                f"tsnap: DTensor '{key}' has a Partial placement (pending reduction): "
                "redistribute it to Shard or Replicate before saving or loading")
        if not (p.is_replicate() or type(p).__name__ == "Shard"):
            raise error(
                "invalid_argument",
                f"tsnap: DTensor '{key}' has placement {p!r}, whose local tensor is not one "
                "block of the global tensor; redistribute it to Shard(d)/Replicate()")
    mesh = dt.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None, None, None
    shape, offsets = compute_local_shape_and_global_offset(dt.shape, mesh, dt.placements)
    return list(coordinate), [int(s) for s in shape], [int(o) for o in offsets]


def _writes_piece(key: str, dt: Any, coordinate: list[int]) -> bool:
    """Whether this rank writes its piece: of the replicas of a piece (the ranks that differ
    only in the mesh dimensions that replicate it), the one that a hash of the key and the
    piece picks, so that replicated dimensions spread the pieces over their ranks."""
    mesh_shape = list(dt.device_mesh.shape)
    replica, replicas, piece = 0, 1, 0
    for d, p in enumerate(dt.placements):
        if p.is_replicate():
            replica = replica * mesh_shape[d] + coordinate[d]
            replicas *= mesh_shape[d]
        else:
            piece = piece * mesh_shape[d] + coordinate[d]
    return replica == (zlib.crc32(key.encode()) + piece) % replicas


# What to_pieces does with a DTensor, decided from its layout alone (global shape, placements,
# mesh): (kind, local shape, global shape, offsets). kind: "skip" (not on this rank's mesh, or a
# replica another rank writes), "empty" (a tensor with no elements, written whole by the rank at
# the mesh's origin), "replicated" (every placement Replicate over the whole group), "piece".
_Plan = tuple[str, list[int], list[int], list[int]]
#: Plans by (key, shape, placements, mesh), kept by a Snapshotter between its saves: the
#: DTensor work (mesh coordinates, shard sizes and offsets) is most of a save's Python time on
#: a sharded state, and a state's layout does not change from one save to the next.
Layouts = dict[tuple[Any, ...], _Plan]
_MAX_LAYOUTS = 1 << 16  # entries a Layouts keeps before it starts over


def _plan_piece(key: str, t: Any, world: int) -> _Plan:
    coordinate, shape, offsets = _layout(key, t)
    mesh_size = t.device_mesh.size()
    if mesh_size > world:
        raise error(
            "invalid_argument",
            f"tsnap: DTensor '{key}' is spread over {mesh_size} ranks but the save has "
            f"{world}: save it with a DistGroup (Snapshotter(root, "
            "group=tsnap.DistGroup()) on every rank)")
    global_shape = [int(s) for s in t.shape]
    if coordinate is None:
        return "skip", [], global_shape, []
    if all(p.is_replicate() for p in t.placements) and mesh_size == world:
        return "replicated", [], global_shape, []
    if torch.Size(global_shape).numel() == 0:
        return ("skip" if any(coordinate) else "empty"), [], global_shape, []
    if not _writes_piece(key, t, coordinate):
        return "skip", [], global_shape, []
    return "piece", shape, global_shape, offsets


def to_pieces(tensors: Tensors, group: DistGroup | None,
              layouts: Layouts | None = None) -> tuple[Tensors, Shards]:
    """The tensors a rank saves, and their shard specs: ``(tensors, shards)``.

    ``tensors`` is the flat state (keys -> tensors, DTensors among them). Each DTensor becomes
    this rank's piece (or nothing: a replica that another rank writes, an empty piece), or a
    replicated entry when every placement is Replicate and its mesh spans the group.
    ``layouts``: what earlier calls decided for each key's layout, reused and added to.
    """
    DTensor = _dtensor_type()
    if DTensor is None or not any(isinstance(t, DTensor) for t in tensors.values()):
        return tensors, {}
    world = group.world_size if group is not None else 1
    out: Tensors = {}
    shards: Shards = {}
    with torch.no_grad():  # to_local() is then the local tensor itself, not an autograd op
        for key, t in tensors.items():
            if not isinstance(t, DTensor):
                out[key] = t
                continue
            where = (key, t.shape, t.placements, t.device_mesh)
            plan = layouts.get(where) if layouts is not None else None
            if plan is None:
                plan = _plan_piece(key, t, world)
                if layouts is not None:
                    if len(layouts) >= _MAX_LAYOUTS:
                        layouts.clear()
                    layouts[where] = plan
            kind, shape, global_shape, offsets = plan
            if kind == "skip":
                continue
            if kind == "empty":
                out[key] = torch.empty(global_shape, dtype=t.dtype)
                shards[key] = (global_shape, [0] * len(global_shape))
                continue
            local = t.to_local()
            if kind == "replicated":
                out[key] = local  # a replicated entry: the engine dedups and balances it
                continue
            if local.numel() == 0:
                continue
            if list(local.shape) != shape:
                raise error(
                    "invalid_argument",
                    f"tsnap: DTensor '{key}': its local tensor has shape {list(local.shape)}, "
                    f"its placements {t.placements} give {shape} (padded shards are not "
                    "supported)")
            out[key] = local
            shards[key] = (global_shape, offsets)
    return out, shards


def to_destinations(
        tensors: Tensors) -> tuple[Tensors, Shards, list[tuple[torch.Tensor, torch.Tensor]]]:
    """What a load writes into: ``(tensors, shards, copy_back)``.

    Each DTensor becomes this rank's local tensor with its region of the global tensor;
    destinations the engine cannot take (not contiguous) get a contiguous buffer on their
    device, and ``copy_back`` lists the ``(destination, buffer)`` pairs to copy once the load
    is done. The engine loads CPU and GPU tensors alike (a GPU one through pinned memory).
    """
    DTensor = _dtensor_type()
    out: Tensors = {}
    shards: Shards = {}
    copy_back: list[tuple[torch.Tensor, torch.Tensor]] = []
    for key, t in tensors.items():
        if DTensor is not None and isinstance(t, DTensor):
            coordinate, shape, offsets = _layout(key, t)
            if coordinate is None:
                continue
            local = t.to_local()  # an empty piece reads nothing but counts as loaded
            shards[key] = ([int(s) for s in t.shape], offsets)
            t = local
        if not t.is_contiguous():
            buffer = torch.empty(t.shape, dtype=t.dtype, device=t.device)
            copy_back.append((t, buffer))
            t = buffer
        out[key] = t
    return out, shards, copy_back


def finish_destinations(copy_back: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():  # parameters that require grad are written in place, as C++ does
        for dest, buffer in copy_back:
            dest.copy_(buffer)
