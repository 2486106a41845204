"""What the trainer integrations (tsnap.lightning, tsnap.accelerate, tsnap.transformers) share:
saves in the background whose removals wait for them, the check of a state before a save, and
RNG states as a snapshot holds them.

Pure Python over ``tsnap.Snapshotter``; needs none of lightning, accelerate or transformers
(numpy is imported when an RNG state is taken or set).
"""

from __future__ import annotations

import errno as errno_names
import os
import random
import re
import secrets
import shutil
import time
import warnings
from typing import Any

import torch

from . import _C
from ._api import DtypeRules, SaveHandle, Snapshotter
from ._errors import _CLASSES, ErrorCode, error
from ._tree import State, Tensors, flatten

MANIFEST = "MANIFEST.json"


def is_snapshot(path: str) -> bool:
    """Whether ``path`` is a committed snapshot directory (it has a manifest)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))


def same_path(a: str, b: str) -> bool:
    """Whether two absolute paths name the same checkpoint (one may be a link to the other)."""
    return a == b or os.path.realpath(a) == os.path.realpath(b)


def untagged(e: BaseException) -> str:
    """The message of ``e`` without the ``tsnap: `` that tsnap's own errors start with."""
    text = str(e)
    return text[len("tsnap: "):] if text.startswith("tsnap: ") else text


def checked(state: State, prefix: str, target: str, hint: str = "") -> Tensors:
    """The tensors of ``state`` by key; raises tsnap.InvalidArgument naming the key of a value a
    snapshot cannot hold (``hint`` is appended to the message)."""
    try:
        tensors, _ = flatten(state)
    except (TypeError, ValueError) as e:
        raise error("invalid_argument",
                    f"{prefix}: cannot save {target}: {untagged(e)}{hint}") from None
    return tensors


# -- RNG states ------------------------------------------------------------------------------


def optimizer_state_bytes(optimizer: torch.optim.Optimizer,
                          dtype: torch.dtype | None = None) -> int:
    """The bytes a snapshot of ``optimizer``'s parameters and state stages on this process: each
    tensor once (this rank's piece of a DTensor), floating ones of more than one element in
    ``dtype`` when given (as a save with that dtype stores them)."""
    seen: set[int] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if not torch.is_tensor(t) or id(t) in seen:
            return
        seen.add(id(t))
        local = t.to_local() if hasattr(t, "to_local") else t
        size = local.element_size()
        if dtype is not None and local.is_floating_point() and local.numel() > 1:
            size = torch.empty((), dtype=dtype).element_size()
        total += local.numel() * size

    for group in optimizer.param_groups:
        for p in group["params"]:
            add(p)
    for per_param in optimizer.state.values():
        for value in per_param.values():
            add(value)
    return total


def staging_bytes(state_bytes: int, options: dict[str, Any]) -> int:
    """The staging pool a Snapshotter with ``options`` (its keyword arguments) makes with the
    automatic budget for a state of ``state_bytes``: the bytes plus a partial chunk per I/O
    thread, twice with ``keep_hot``; a fixed ``staging_budget`` is itself."""
    if int(options.get("staging_budget", 0)) > 0:
        return int(options["staging_budget"])
    chunk = int(options.get("chunk_bytes", 16 << 20))
    chunks = (-(-state_bytes // chunk) + int(options.get("io_threads", 4))) * (
        2 if options.get("keep_hot", False) else 1)
    cap = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4 // chunk
    return max(2, min(chunks, cap)) * chunk


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's, torch's CPU and (when CUDA is available) every CUDA
    device's generator, as tensors and plain values."""
    import numpy as np

    version, words, gauss_next = random.getstate()
    legacy: Any = np.random.get_state(legacy=True)  # a tuple, for the legacy MT19937 state
    kind, keys, pos, has_gauss, cached = legacy
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(words, dtype=torch.int64),
                   "gauss_next": gauss_next},
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], prefix: str, target: str) -> None:
    """Sets the generators from ``rng_state()``'s record; raises tsnap.FormatError when it is
    not one."""
    import numpy as np

    try:
        py, npy = state["python"], state["numpy"]
        random.setstate((int(py["version"]), tuple(int(w) for w in py["state"].tolist()),
                         py["gauss_next"]))
        np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), int(npy["pos"]),
                             int(npy["has_gauss"]), float(npy["cached_gaussian"])))
        torch.set_rng_state(state["cpu"])
        cuda = state.get("cuda")
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise error("bad_manifest", f"{prefix}: {target}: its RNG states are not valid "
                    f"({type(e).__name__}: {e})") from None
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            warnings.warn(f"{prefix}: {target} holds the RNG states of {len(cuda)} CUDA "
                          f"devices, this process sees {torch.cuda.device_count()}: the CUDA "
                          "generators are left as they are", RuntimeWarning, stacklevel=3)


# -- saves in the background -----------------------------------------------------------------


class Save:
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

    def __init__(self, path: str, after: list[Save]) -> None:
        self.path = path
        self.after = after


class Saves:
    """Saves started in the background, one ``Snapshotter`` per root directory, and removals
    queued until the saves in flight when they were asked for have committed (dropped, keeping
    the snapshot, when one of those fails). Failures are kept until ``raise_failure``; each
    names the save's path and errno (ENOSPC). One thread at a time."""

    def __init__(self, prefix: str, options: dict[str, Any]) -> None:
        self.prefix = prefix
        self._options = options
        self._snapshotters: dict[str, Snapshotter] = {}
        self._saves: list[Save] = []            # in flight, oldest first
        self._removals: list[_Removal] = []     # queued, oldest first
        self._failures: list[BaseException] = []  # not raised yet

    def error(self, code: ErrorCode, message: str) -> _C.Error:
        return error(code, f"{self.prefix}: {message}")

    def ready(self) -> None:
        """Collects the saves that completed and raises the first failure not raised yet:
        what a save does before it looks at its state."""
        self.reap()
        self.raise_failure()

    def started(self) -> bool:
        """Whether a Snapshotter was made (a save or a prepare came first)."""
        return bool(self._snapshotters)

    def snapshotter(self, root: str) -> Snapshotter:
        """The Snapshotter of the directory ``root`` (made, and ``root`` with it, when new)."""
        os.makedirs(root, exist_ok=True)
        key = os.path.realpath(root)
        snap = self._snapshotters.get(key)
        if snap is None:
            snap = self._snapshotters[key] = Snapshotter(root, **self._options)
        return snap

    def prepare(self, root: str, state: State, *, dtype: torch.dtype | None = None,
                dtype_rules: DtypeRules = None) -> None:
        """Sizes and faults in the staging buffers of the saves into ``root`` for ``state``
        (``Snapshotter.prepare``), so that the first save stalls no longer than the later ones;
        a no-op once they exist."""
        self.snapshotter(root).prepare(state, dtype, dtype_rules=dtype_rules)

    def start(self, path: str, state: State, metadata: dict[str, Any], *,
              overwrite: bool = False, dtype: torch.dtype | None = None,
              dtype_rules: DtypeRules = None, incremental: bool | None = None) -> Save:
        """Starts saving ``state`` (``ready()`` called, ``checked()`` passed) as the snapshot
        directory ``path``; returns once staged. A queued removal of ``path`` is dropped."""
        root, name = os.path.split(path)
        snap = self.snapshotter(root)
        self._removals = [r for r in self._removals if not same_path(r.path, path)]
        handle = snap.save_async(name, state, metadata=metadata, dtype=dtype,
                                 dtype_rules=dtype_rules, overwrite=overwrite,
                                 incremental=incremental)
        save = Save(path, handle)
        self._saves.append(save)
        return save

    @property
    def in_flight(self) -> list[str]:
        """The paths of the saves not known to be complete, oldest first."""
        self.reap()
        return [s.path for s in self._saves]

    def unfinished(self) -> list[str]:
        """The paths of the saves not waited for yet (without collecting completed ones)."""
        return [s.path for s in self._saves if not s.finished]

    def numbered(self, root: str, pattern: re.Pattern[str],
                 include_in_flight: bool) -> dict[str, int]:
        """The directories in ``root`` whose names ``pattern`` matches (group 1: a number), and
        with ``include_in_flight`` the saves in flight there, by path (in that order); less
        those whose removal is queued."""
        found: dict[str, int] = {}
        names = os.listdir(root) if os.path.isdir(root) else []
        for name in names:
            m = pattern.match(name)
            path = os.path.join(root, name)
            if m and os.path.isdir(path):
                found[path] = int(m.group(1))
        if include_in_flight:
            for path in self.in_flight:
                m = pattern.match(os.path.basename(path))
                if m and os.path.dirname(path) == root:
                    found[path] = int(m.group(1))
        removing = {r.path for r in self._removals}
        return {p: n for p, n in found.items() if p not in removing}

    def remove(self, path: str) -> None:
        """Removes the snapshot at ``path`` now, or once the saves in flight have committed."""
        self.reap()
        self._removals = [r for r in self._removals if not same_path(r.path, path)]
        if self._saves:
            self._removals.append(_Removal(path, list(self._saves)))
        else:
            self._remove(path)

    def wait_for(self, path: str) -> None:
        """Waits for the saves of ``path``; raises the failure of the last one."""
        last: Save | None = None
        for save in self._saves:
            if same_path(save.path, path):
                self._finish(save)
                last = save
        self.reap()
        if last is not None and last.error is not None:
            self._failures = [f for f in self._failures if f is not last.error]
            raise last.error

    def wait_in(self, root: str) -> None:
        """Waits for the saves into the directory ``root``; their failures are raised later."""
        for save in self._saves:
            if same_path(os.path.dirname(save.path), root):
                self._finish(save)

    def wait(self) -> None:
        """Waits for every save and queued removal; raises the first failure not raised yet
        (the others as warnings)."""
        for save in self._saves:
            self._finish(save)
        self._saves = []
        self._run_removals()
        self.raise_failure(all_of_them=True)

    def close(self) -> None:
        """``wait()``, then closes the Snapshotters (a later save makes new ones)."""
        try:
            self.wait()
        finally:
            snaps, self._snapshotters = list(self._snapshotters.values()), {}
            for snap in snaps:
                snap.close()

    def reap(self) -> None:
        """Collects the saves that completed, then does the removals that may be done."""
        still: list[Save] = []
        for save in self._saves:
            if save.handle.done():
                self._finish(save)
            else:
                still.append(save)
        self._saves = still
        self._run_removals()

    def raise_failure(self, all_of_them: bool = False) -> None:
        if not self._failures:
            return
        first, rest = self._failures[0], self._failures[1:]
        self._failures = []
        if all_of_them:
            for other in rest:
                warnings.warn(f"{self.prefix}: another save failed too: {other}",
                              RuntimeWarning, stacklevel=3)
        else:
            self._failures = rest
        raise first

    def _finish(self, save: Save) -> None:
        if save.finished:
            return
        try:
            save.handle.wait()
        except _C.Error as e:
            save.error = self._failed(save.path, e)
            self._failures.append(save.error)
        save.finished = True

    def _failed(self, path: str, e: _C.Error) -> _C.Error:
        """The failure of the save of ``path``, naming it and the errno (ENOSPC) of ``e``."""
        code: Any = getattr(e, "code", "io")
        number = getattr(e, "errno", 0) or 0
        name = errno_names.errorcode.get(number)
        out = self.error(code if code in _CLASSES else "io",
                         f"the save of {path} failed" + (f" ({name})" if name else "") +
                         f": {untagged(e)}")
        out.errno = number
        out.__cause__ = e
        return out

    def _run_removals(self) -> None:
        queued: list[_Removal] = []
        for removal in self._removals:
            if not all(s.finished for s in removal.after):
                queued.append(removal)
                continue
            failed = [s for s in removal.after if s.error is not None]
            if failed:
                warnings.warn(f"{self.prefix}: kept {removal.path}: the save of "
                              f"{failed[0].path} failed while its removal waited for it",
                              RuntimeWarning, stacklevel=4)
                continue
            try:
                self._remove(removal.path)
            except _C.Error as e:
                self._failures.append(e)
        self._removals = queued

    def _remove(self, path: str) -> None:
        """Removes a snapshot directory, renamed to a temporary name first
        (tsnap::remove_snapshot's protocol: readers and ``latest`` skip it, the next writer in
        that directory removes a leftover), another directory, or a file or link (never what
        it links to)."""
        try:
            if os.path.islink(path):
                os.remove(path)
            elif is_snapshot(path):
                root, name = os.path.split(path)
                temporary = os.path.join(
                    root, f".{name}.tmp-{time.time_ns():016x}-{secrets.randbits(32):08x}")
                os.rename(path, temporary)
                shutil.rmtree(temporary, ignore_errors=True)
            elif os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise self.error("io", f"cannot remove the checkpoint {path}: {e}") from None
