# Types of the extension module tsnap._C (python/src/tsnap_ext.cpp), for type checkers.
from collections.abc import Callable
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]
# key -> (global shape, offsets) of a piece of a sharded tensor.
Shards = dict[str, tuple[list[int], list[int]]]
# A torch.dtype or None, or (that, [(glob pattern, dtype or None), ...]) with per-key rules.
DtypeArg = torch.dtype | None | tuple[torch.dtype | None, list[tuple[str, torch.dtype | None]]]

TORCH_BUILD_VERSION: str

class Error(RuntimeError):
    code: str
    errno: int

class IoError(Error): ...
class FormatError(Error): ...
class InvalidArgument(Error, ValueError): ...

class SaveStats:
    @property
    def stall_s(self) -> float: ...
    @property
    def stage_s(self) -> float: ...
    @property
    def write_s(self) -> float: ...
    @property
    def commit_s(self) -> float: ...
    @property
    def total_s(self) -> float: ...
    @property
    def bytes(self) -> int: ...
    @property
    def written_bytes(self) -> int: ...
    @property
    def linked_bytes(self) -> int: ...
    @property
    def reused_bytes(self) -> int: ...
    @property
    def tensor_bytes(self) -> int: ...
    @property
    def chunks(self) -> int: ...
    @property
    def files(self) -> int: ...
    @property
    def tensors(self) -> int: ...
    @property
    def buffer_waits(self) -> int: ...
    @property
    def buffers_reused(self) -> int: ...
    @property
    def engine(self) -> str: ...
    @property
    def direct(self) -> bool: ...
    @property
    def unchanged_since(self) -> str: ...
    @property
    def unchanged_tensors(self) -> int: ...
    @property
    def stale(self) -> list[str]: ...
    @property
    def throughput_gbps(self) -> float: ...

class SaveHandle:
    def wait(self, timeout: float = -1.0) -> bool: ...
    def done(self) -> bool: ...
    def wait_staged(self) -> None: ...
    @property
    def stats(self) -> SaveStats: ...
    @property
    def path(self) -> str: ...

class DistGroup:
    def __init__(
        self, store: object, rank: int, world_size: int, timeout: float, prefix: str
    ) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...

class Snapshotter:
    def __init__(
        self,
        root: str,
        staging_budget: int,
        chunk_bytes: int,
        stage_threads: int,
        io_threads: int,
        queue_depth: int,
        engine: str,
        direct_io: bool,
        max_in_flight: int,
        fail_fast: bool,
        incremental: bool,
        keep_hot: bool,
        durable_root: str,
        drain_bytes_per_second: int,
        local_keep_last: int,
        group: DistGroup | None = None,
        node_local: bool = False,
        agent: str = "",
        agent_fall_back: bool = False,
    ) -> None: ...
    def save_async(
        self,
        name: str,
        tensors: Tensors,
        metadata: str,
        dtype: DtypeArg,
        staging: str,
        overwrite: bool,
        num_shards: int,
        chunk_bytes: int,
        incremental: bool | None,
        shards: Shards = ...,
        step: int | None = None,
        must_change: list[str] = ...,
        fail_if_stale: bool = False,
    ) -> SaveHandle: ...
    def abandon(self, name: str, reason: str) -> None: ...
    def prepare(
        self,
        tensors: Tensors,
        dtype: DtypeArg,
        num_shards: int,
        chunk_bytes: int,
        shards: Shards = ...,
    ) -> None: ...
    def wait_all(self) -> None: ...
    def load_hot(
        self, include: list[str], exclude: list[str], /
    ) -> tuple[str, str, Tensors] | None: ...
    def drain_wait(self) -> None: ...
    def latest(self) -> str | None: ...
    def close(self) -> None: ...
    @property
    def root(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def staging_budget(self) -> int: ...

def save(
    path: str,
    tensors: Tensors,
    metadata: str,
    dtype: DtypeArg,
    overwrite: bool,
    num_shards: int,
    shards: Shards = ...,
) -> SaveStats: ...
def load(
    path: str,
    include: list[str],
    exclude: list[str],
    verify: bool,
    key_prefix: str,
    allow_unmatched: bool,
    /,
) -> Tensors: ...
def load_into(
    path: str,
    dest: Tensors,
    include: list[str],
    exclude: list[str],
    verify: bool,
    key_prefix: str,
    allow_unmatched: bool,
    require_every_key: bool,
    atomic: bool,
    shards: Shards = ...,
) -> dict[str, Any]: ...
def metadata(path: str, /) -> str: ...
def reserve_staging(nbytes: int, wait: bool) -> None: ...
def reserved_staging_bytes() -> int: ...
def latest(root: str, /) -> str | None: ...
def verify(path: str, /) -> list[dict[str, Any]]: ...

class PeriodicStats:
    @property
    def snapshots(self) -> list[dict[str, Any]]: ...
    @property
    def skipped(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def deleted(self) -> int: ...
    @property
    def stall_s(self) -> float: ...
    @property
    def bytes(self) -> int: ...

class PeriodicSnapshots:
    def __init__(
        self,
        snapshotter: Snapshotter,
        make_state: Callable[[], tuple[Any, ...]],
        every_steps: int,
        every_seconds: float,
        on_signals: list[int],
        keep_last: int,
        keep_every_steps: int,
        dtype: DtypeArg,
        staging: str,
        wait_when_busy: bool,
        log: bool,
        at_steps: list[int],
        continuous: bool,
        min_interval_seconds: float,
        max_overhead: float,
        keep_every_seconds: float,
        keep_best: int,
        best_metric: str,
        best_mode: str,
        keep_without_metric: bool,
        stale_check: bool,
        must_change: list[str],
        fail_if_stale: bool,
    ) -> None: ...
    def resume(self, apply: Callable[[Tensors, str], None], /) -> int: ...
    def after_step(self, step: int, /) -> None: ...
    def before_optimizer_step(self) -> None: ...
    @property
    def stop_requested(self) -> bool: ...
    @property
    def stop_signal(self) -> int: ...
    def finish(self) -> PeriodicStats: ...
    def stats(self) -> PeriodicStats: ...
    def close(self) -> None: ...
