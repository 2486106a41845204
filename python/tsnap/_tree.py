"""Nested state <-> flat ``{key: tensor}`` plus a JSON description of the structure.

A state is a dict (``model.state_dict()``, ``optimizer.state_dict()``, or a dict of those and of
plain values). Its tensors are saved under keys made of their path joined by ``/``
(``"optim/state/0/exp_avg"``; a flat ``model.state_dict()`` keeps its own keys), and everything
else (dicts with their key types, lists, tuples, numbers, strings, None) is kept in the
snapshot's metadata as a tree whose leaves name those keys, so that a load gives back the same
structure. Pure Python, no I/O.
"""

import collections
import math

import torch

SEP = "/"
# The metadata key of the structure (beside the user's keys and the C++ checkpoint's "tsnap").
TREE_KEY = "tsnap_python"
_INT64 = (-(2**63), 2**63 - 1)


def flatten(state):
    """Returns ``(tensors, tree)``: the tensors of ``state`` by key and its structure (JSON-able).

    Raises TypeError for a value that is neither a tensor, a container nor a plain value, and
    ValueError when two paths make the same key.
    """
    if not isinstance(state, dict):
        raise TypeError(f"tsnap: a state must be a dict, not {type(state).__name__}")
    tensors = {}
    tree = _encode(state, (), tensors)
    return tensors, tree


def _key(path):
    return SEP.join(str(p) for p in path)


def _where(path):
    return f"'{_key(path)}'" if path else "the top level"


def _encode(value, path, tensors):
    if isinstance(value, torch.Tensor):
        key = _key(path)
        if not key:
            raise ValueError("tsnap: a tensor needs a key (put it in a dict)")
        if key in tensors:
            raise ValueError(f"tsnap: two values of the state have the key '{key}'")
        tensors[key] = value
        return {"t": key}
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"tsnap: dict key {k!r} at {_where(path)} is a "
                                f"{type(k).__name__}; keys must be str or int")
            items.append([k, _encode(v, path + (k,), tensors)])
        node = {"d": items}
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


def unflatten(tree, tensors):
    """The state that ``tree`` describes, with the tensors of ``tensors``.

    A tensor that ``tensors`` lacks (a load that selected keys) is left out: a dict drops the
    entry (and an entry whose tensors are all missing), a list or tuple keeps None in its place.
    """
    out = _decode(tree, tensors)
    return {} if out is _MISSING else out


def _decode(node, tensors):
    if "t" in node:
        return tensors.get(node["t"], _MISSING)
    if "d" in node:
        out = collections.OrderedDict() if node.get("o") else {}
        for k, v in node["d"]:
            value = _decode(v, tensors)
            if value is not _MISSING:
                out[k] = value
        if not out and node["d"]:
            return _MISSING  # every entry was left out: leave the dict out too
        return out
    if "l" in node or "tu" in node:
        items = [_decode(v, tensors) for v in node.get("l", node.get("tu"))]
        items = [None if v is _MISSING else v for v in items]
        return items if "l" in node else tuple(items)
    if "v" in node:
        return node["v"]
    if "bi" in node:
        return int(node["bi"])
    if "f" in node:
        return float(node["f"])
    if "dt" in node:
        return getattr(torch, node["dt"])
    raise ValueError(f"tsnap: unknown node in the saved structure: {node!r}")
