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


def _bad(what):
    from . import _C  # the extension's error classes (imported late: this module has no I/O)
    e = _C.FormatError(f"tsnap: the snapshot's structure record ('{TREE_KEY}' in its "
                       f"metadata) is not valid: {what}")
    e.code = "bad_manifest"
    e.errno = 0
    return e


def unflatten(tree, tensors, complete=True):
    """The state that ``tree`` describes, with the tensors of ``tensors``.

    A tensor that ``tensors`` lacks (a load that selected keys, ``complete=False``) is left out:
    a dict drops the entry (and an entry whose tensors are all missing), a list or tuple keeps
    None in its place. The record is checked against the tensors it names: every node well
    formed, each tensor key named once, and with ``complete`` every tensor of ``tensors`` named
    and every named key present; else tsnap.FormatError.
    """
    named = set()
    out = _decode(tree, tensors, named)
    loaded = set(tensors)
    if not loaded <= named:
        extra = sorted(loaded - named)
        raise _bad(f"it does not name {len(extra)} of the snapshot's tensors "
                   f"({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''})")
    if complete and named != loaded:
        missing = sorted(named - loaded)
        raise _bad(f"it names {len(missing)} tensor key(s) the snapshot does not hold "
                   f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    return {} if out is _MISSING else out


_KINDS = {"t", "d", "l", "tu", "v", "bi", "f", "dt"}


def _decode(node, tensors, named):
    if not isinstance(node, dict):
        raise _bad(f"a node is a {type(node).__name__}, not an object")
    kinds = _KINDS.intersection(node)
    if len(kinds) != 1 or not set(node) <= _KINDS | {"o"} or ("o" in node and "d" not in node):
        raise _bad(f"unknown node {str(node)[:80]}")
    kind = kinds.pop()
    value = node[kind]
    if kind == "t":
        if not isinstance(value, str) or not value:
            raise _bad(f"a tensor key is {value!r}, not a non-empty string")
        if value in named:
            raise _bad(f"the tensor key '{value}' is named twice")
        named.add(value)
        return tensors.get(value, _MISSING)
    if kind == "d":
        if not isinstance(value, list):
            raise _bad("a dict's items are not a list")
        out = collections.OrderedDict() if node.get("o") else {}
        for item in value:
            if (not isinstance(item, list) or len(item) != 2 or isinstance(item[0], bool)
                    or not isinstance(item[0], (str, int))):
                raise _bad(f"a dict item is {str(item)[:80]}, not a [str or int key, node] pair")
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
            raise _bad(f"a big integer is {str(value)[:40]!r}") from None
    if kind == "f":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if value in ("inf", "-inf", "nan"):
            return float(value)
        raise _bad(f"a float is {str(value)[:40]!r}")
    dtype = getattr(torch, value, None) if isinstance(value, str) else None
    if not isinstance(dtype, torch.dtype):
        raise _bad(f"{str(value)[:40]!r} is not a torch dtype")
    return dtype
