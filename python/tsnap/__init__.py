"""tsnap: asynchronous, atomically committed snapshots of PyTorch training state.

A Python front-end over tsnap's C++ engine (staging copy into pooled buffers, io_uring
O_DIRECT writes of safetensors shards, atomic commit with MANIFEST.json)::

    snap = tsnap.Snapshotter("runs/exp1")
    h = snap.save_async("step-100", {"model": model.state_dict(), "optim": opt.state_dict()})
    ...                              # training goes on; the snapshot is the state at the call
    h.wait()                         # committed (raises tsnap.Error if the save failed)
    state = tsnap.load(tsnap.latest("runs/exp1"))

Nested state (dicts, lists, tuples, int-keyed optimizer state, plain values) is saved as flat
tensors plus its structure in the manifest, and loaded back as the same structure. Every
blocking call releases the GIL; a background error is raised by ``SaveHandle.wait()``.
"""

from __future__ import annotations

import os

import torch

from . import _build_info

if torch.__version__ != _build_info.TORCH_VERSION:
    raise ImportError(
        f"tsnap {_build_info.TSNAP_VERSION} was built for torch {_build_info.TORCH_VERSION} but "
        f"torch {torch.__version__} is installed: install torch=={_build_info.TORCH_VERSION}, or "
        f"a tsnap built for torch {torch.__version__} (from a clone: "
        "pip install --no-build-isolation .)")

# After the version check: a mismatched module may not load (E402 is off for this file).
from . import _C
from ._api import (
    SaveHandle,
    Snapshotter,
    latest,
    load,
    load_into,
    metadata,
    reserve_staging,
    reserved_staging_bytes,
    save,
    verify,
)
from ._dist import DistGroup
from ._optim import load_optimizer_state_dict, optimizer_state_dict
from .periodic import PeriodicSnapshots

Error = _C.Error
IoError = _C.IoError
FormatError = _C.FormatError
InvalidArgument = _C.InvalidArgument
SaveStats = _C.SaveStats

__version__: str = _build_info.TSNAP_VERSION
#: The prefix that holds tsnap's C++ package in the binary wheel (include/, lib/, the CMake
#: package): ``cmake -DCMAKE_PREFIX_PATH="$(python -c 'import torch, tsnap;
#: print(torch.utils.cmake_prefix_path + ";" + tsnap.cmake_prefix_path)')"`` then
#: ``find_package(tsnap)``, as ``torch.utils.cmake_prefix_path`` does for LibTorch.
cmake_prefix_path: str = os.path.dirname(os.path.abspath(__file__))
__all__ = [
    "DistGroup", "Error", "FormatError", "InvalidArgument", "IoError", "PeriodicSnapshots",
    "SaveHandle", "SaveStats", "Snapshotter", "latest", "load", "load_into",
    "load_optimizer_state_dict", "metadata", "optimizer_state_dict", "reserve_staging",
    "reserved_staging_bytes", "save", "verify",
]
