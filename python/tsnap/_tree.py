"""Nested state <-> flat ``{key: tensor}`` plus a JSON description of the structure.

A state is a dict (``model.state_dict()``, ``optimizer.state_dict()``, or a dict of those and of
plain values). Its tensors are saved under keys made of their path joined by ``/``
(``"optim/state/0/exp_avg"``; a flat ``model.state_dict()`` keeps its own keys), and everything
else (dicts with their key types, lists, tuples, numbers, strings, None) is kept in the
snapshot's metadata as a tree whose leaves name those keys, so that a load gives back the same
structure. Pure Python, no I/O.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any

import torch

# A state: a dict of tensors, containers and plain values (nested).
State = dict[Any, Any]
# Flat tensors by key.
Tensors = dict[str, torch.Tensor]

SEP = "/"
# The metadata key of the structure (beside the user's keys and the C++ checkpoint's "tsnap").
TREE_KEY = "tsnap_python"
_INT64 = (-(2**63), 2**63 - 1)


def flatten(state: State) -> tuple[Tensors, dict[str, Any]]:
    """Returns ``(tensors, tree)``: the tensors of ``state`` by key and its structure (JSON-able).

    Raises TypeError for a value that is neither a tensor, a container nor a plain value, and
    ValueError when two paths make the same key.
    """
    if not isinstance(state, dict):
        raise TypeError(f"tsnap: a state must be a dict, not {type(state).__name__}")
    tensors: Tensors = {}
    tree = _encode(state, (), tensors)
    return tensors, tree


def _key(path: tuple[str | int, ...]) -> str:
    return SEP.join(str(p) for p in path)


def _where(path: tuple[str | int, ...]) -> str:
    return f"'{_key(path)}'" if path else "the top level"


def _encode(value: Any, path: tuple[str | int, ...], tensors: Tensors) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        key = _key(path)
        if not path:
            raise ValueError("tsnap: a tensor needs a key (put it in a dict)")
        if not key or "" in (str(p) for p in path):
            raise ValueError(f"tsnap: the tensor at {path!r} has an empty key or key part: "
                             "its saved key would be empty or ambiguous")
        if key in tensors:
            raise ValueError(f"tsnap: two values of the state have the key '{key}'")
        tensors[key] = value
        return {"t": key}
    if isinstance(value, dict):
        items: list[Any] = []
        for k, v in value.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"tsnap: dict key {k!r} at {_where(path)} is a "
                                f"{type(k).__name__}; keys must be str or int")
            items.append([k, _encode(v, path + (k,), tensors)])
        node: dict[str, Any] = {"d": items}
        if isinstance(value, collections.OrderedDict):
            node["o"] = True
        return node
    if isinstance(value, (list, tuple)):
        items = [_encode(v, path + (i,), tensors) for i, v in enumerate(value)]
        return {"tu" if isinstance(value, tuple) else "l": items}
    if value is None or isinstance(value, (bool, str)):
        return {"v": value}
    if isinstance(value, int):
        return {"v": value} if _INT64[0] <= value <= _INT64[1] else {"bi": str(value)}
    if isinstance(value, float):
        return {"f": value if math.isfinite(value) else repr(value)}
    if isinstance(value, torch.dtype):
        return {"dt": str(value).split(".")[-1]}
    raise TypeError(f"tsnap: cannot save a {type(value).__name__} at {_where(path)}: a state "
                    "holds tensors, dicts, lists, tuples, int, float, bool, str and None")


_MISSING = object()
_QUOTE_MAX = 80  # characters of a value quoted in an error message


def _q(value: object, limit: int = _QUOTE_MAX) -> str:
    """``value`` as text for an error message, cut to ``limit`` characters."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _names(keys: Sequence[str]) -> str:
    """Up to three keys, each cut, for an error message."""
    return ", ".join(_q(k) for k in keys[:3]) + (", ..." if len(keys) > 3 else "")


def _bad(what: str) -> Exception:
    from ._errors import error  # the extension's error classes (imported late: no I/O here)
    return error("bad_manifest", f"tsnap: the snapshot's structure record ('{TREE_KEY}' in its "
                 f"metadata) is not valid: {what}")


def unflatten(tree: Any, tensors: Tensors, complete: bool = True) -> State:
    """The state that ``tree`` describes, with the tensors of ``tensors``.

    A tensor that ``tensors`` lacks (a load that selected keys, ``complete=False``) is left out:
    a dict drops the entry (and an entry whose tensors are all missing), a list or tuple keeps
    None in its place. The record is checked against the tensors it names: every node well
    formed, each tensor key named once, and with ``complete`` every tensor of ``tensors`` named
    and every named key present; else tsnap.FormatError.
    """
    named: set[str] = set()
    out = _decode(tree, tensors, named)
    loaded = set(tensors)
    if not loaded <= named:
        extra = sorted(loaded - named)
        raise _bad(f"it does not name {len(extra)} of the snapshot's tensors "
                   f"({_names(extra)})")
    if complete and named != loaded:
        missing = sorted(named - loaded)
        raise _bad(f"it names {len(missing)} tensor key(s) the snapshot does not hold "
                   f"({_names(missing)})")
    return {} if out is _MISSING else out


_KINDS = {"t", "d", "l", "tu", "v", "bi", "f", "dt"}


def _decode(node: Any, tensors: Tensors, named: set[str]) -> Any:
    if not isinstance(node, dict):
        raise _bad(f"a node is a {type(node).__name__}, not an object")
    kinds = _KINDS.intersection(node)
    if len(kinds) != 1 or not set(node) <= _KINDS | {"o"} or ("o" in node and "d" not in node):
        raise _bad(f"unknown node {_q(str(node))}")
    kind = kinds.pop()
    value = node[kind]
    if kind == "t":
        if not isinstance(value, str) or not value:
            raise _bad(f"a tensor key is {_q(repr(value))}, not a non-empty string")
        if value in named:
            raise _bad(f"the tensor key '{_q(value)}' is named twice")
        named.add(value)
        return tensors.get(value, _MISSING)
    if kind == "d":
        if not isinstance(value, list):
            raise _bad("a dict's items are not a list")
        out = collections.OrderedDict() if node.get("o") else {}
        for item in value:
            if (not isinstance(item, list) or len(item) != 2 or isinstance(item[0], bool)
                    or not isinstance(item[0], (str, int))):
                raise _bad(f"a dict item is {_q(str(item))}, not a [str or int key, node] pair")
            k, v = item
            decoded = _decode(v, tensors, named)
            if decoded is not _MISSING:
                out[k] = decoded
        if not out and value:
            return _MISSING  # every entry was left out: leave the dict out too
        return out
    if kind in ("l", "tu"):
        if not isinstance(value, list):
            raise _bad("a list's items are not a list")
        items = [_decode(v, tensors, named) for v in value]
        items = [None if v is _MISSING else v for v in items]
        return items if kind == "l" else tuple(items)
    if kind == "v":
        if value is not None and not isinstance(value, (bool, str, int)):
            raise _bad(f"a plain value is a {type(value).__name__}")
        return value
    if kind == "bi":
        try:
            return int(value)
        except (TypeError, ValueError):
            raise _bad(f"a big integer is {_q(repr(value), 40)}") from None
    if kind == "f":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if value in ("inf", "-inf", "nan"):
            return float(value)
        raise _bad(f"a float is {_q(repr(value), 40)}")
    dtype = getattr(torch, value, None) if isinstance(value, str) else None
    if not isinstance(dtype, torch.dtype):
        raise _bad(f"{_q(repr(value), 40)} is not a torch dtype")
    return dtype
