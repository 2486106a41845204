"""The values beyond tsnap's structure record that Lightning's checkpoints commonly carry
(``argparse.Namespace``, ``pathlib`` paths, bytes, sets, ``Counter``, ``defaultdict``, numpy
scalars and small arrays, enum members, classes, omegaconf containers), as plain values plus
tags, and back: tsnap.lightning's codec, and ``Unresolved``, what a load returns for a class it
did not import (public as ``tsnap.lightning.Unresolved``; its errors speak as tsnap.lightning).

Nothing is pickled, and a load imports no class a checkpoint names unless ``import_types``
allows it (builtin classes and those of ``_KNOWN_TYPES`` need no permission).
"""

from __future__ import annotations

import argparse
import base64
import builtins
import collections
import enum
import importlib
import pathlib
import sys
import warnings
from collections.abc import Collection, Mapping
from typing import Any, Callable, Union

import torch

from . import _C
from ._errors import ErrorCode, error
from ._tree import SEP

# Which classes a load may import to restore a type or an enum member: none (False), any (True),
# or these qualified names ("package.module.Class").
ImportTypes = Union[bool, Collection[str]]


def _error(code: ErrorCode, message: str) -> _C.Error:
    return error(code, f"tsnap.lightning: {message}")


# A value that tsnap's structure record cannot hold but that Lightning's checkpoints commonly
# carry is stored as a plain value (in the record, or its tensors in the shards) at the same
# key, and the plugin's record lists [key path, tag, info] for it, innermost first, so that a
# load turns the plain value back into one of the same type. The tags (docs/lightning.md):
#   namespace    argparse.Namespace      a dict of its attributes
#   path         pathlib paths           str; info: the pathlib class
#   bytes        bytes, bytearray        base64 str; info: which
#   set          set, frozenset          a list of the elements (sorted when they sort); info
#   counter      collections.Counter     a list of [key, count] pairs
#   defaultdict  collections.defaultdict a list of [key, value] pairs; info: the factory type
#   numpy        numpy scalar or array   its .tolist(); info: dtype (numpy's str) and shape
#   enum         enum.Enum member        its value; info: the class and the member name
#   type         a class                 None; info: module and qualname
#   omegaconf    DictConfig, ListConfig  OmegaConf.to_container(resolve=False); info: kind

_NUMPY_MAX = 4096  # elements of a numpy array stored in the record
_NUMPY_KINDS = "biufU"  # bool, int, uint, float, str
_PATH_CLASSES = ("PosixPath", "WindowsPath", "Path", "PurePosixPath", "PureWindowsPath",
                 "PurePath")
# Classes restored without ``import_types``: from the standard library, Lightning and omegaconf
# (imported only when installed), whatever the checkpoint says, never a class it names freely.
_KNOWN_TYPES = {
    "collections": {"OrderedDict", "Counter", "defaultdict", "deque"},
    "argparse": {"Namespace"},
    "pathlib": set(_PATH_CLASSES),
    "lightning.fabric.utilities.data": {"AttributeDict"},
    "omegaconf": {"DictConfig", "ListConfig"},
    "omegaconf.dictconfig": {"DictConfig"},
    "omegaconf.listconfig": {"ListConfig"},
}


class Unresolved:
    """What a load returns in place of a class, or an enum member, that a checkpoint names but
    that the load did not import (``import_types`` does not allow it, or the import failed).

    ``kind`` is ``"type"`` or ``"enum"``, ``name`` the class's qualified name
    (``"mypkg.config.Mode"``), ``member`` and ``value`` the enum member's name and stored value
    (None for a type), ``key`` where it was in the checkpoint (``"hyper_parameters/mode"``),
    ``why`` why it was not imported. Calling it (as a ``defaultdict`` calls its factory) raises
    tsnap.Error with that explanation; ``tsnap.lightning.load_from_checkpoint`` refuses
    hyper-parameters that hold one.
    """

    __slots__ = ("key", "kind", "member", "name", "value", "why")

    def __init__(self, kind: str, name: str, key: str, why: str, member: str | None = None,
                 value: Any = None) -> None:
        self.kind, self.name, self.key, self.why = kind, name, key, why
        self.member, self.value = member, value

    def message(self) -> str:
        what = f"the enum member {self.name}.{self.member}" if self.kind == "enum" else \
            f"the class {self.name}"
        return (f"'{self.key}' holds {what}, not imported ({self.why}); pass "
                f"import_types=True or import_types=[{self.name!r}] to import it")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _error("unsupported", self.message())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unresolved) and (
            self.kind, self.name, self.member, self.value) == (
            other.kind, other.name, other.member, other.value)

    def __hash__(self) -> int:
        return hash((self.kind, self.name, self.member))

    def __repr__(self) -> str:
        what = f"{self.name}.{self.member}" if self.kind == "enum" else self.name
        return f"<tsnap.lightning.Unresolved {self.kind} {what} at '{self.key}'>"


def _path_text(where: list[Any]) -> str:
    return f"'{SEP.join(map(str, where))}'" if where else "the top level"


def _type_info(cls: type, where: list[Any]) -> dict[str, str]:
    module, qualname = getattr(cls, "__module__", None), getattr(cls, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        raise TypeError(f"tsnap: cannot save the class {cls!r} at {_path_text(where)}: it has "
                        "no importable qualified name (a class defined in a function?)")
    return {"module": module, "qualname": qualname}


def tagged(value: Any, where: list[Any], out: list[list[Any]]) -> Any:
    """``value`` with every value beyond the structure record replaced by its plain stand-in
    (``value`` itself when there is none; containers are copied only where something changed),
    appending [path, tag, info] to ``out`` for each, innermost first. Raises TypeError naming
    the key for a value of a supported type that cannot be stored (a local class, a big or
    complex numpy array, a defaultdict whose factory is not a class)."""
    if isinstance(value, torch.Tensor) or value is None or type(value) in (bool, int, float, str):
        return value
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, (np.generic, np.ndarray)):
        dtype = value.dtype
        if dtype.kind not in _NUMPY_KINDS or (isinstance(value, np.ndarray)
                                              and value.size > _NUMPY_MAX):
            raise TypeError(f"tsnap: cannot save the numpy {type(value).__name__} of dtype "
                            f"{dtype} and {value.size} element(s) at {_path_text(where)}: the "
                            f"checkpoint keeps numpy values of bool, int, uint, float or str "
                            f"dtype of at most {_NUMPY_MAX} elements (store a big array as a "
                            "tensor: torch.from_numpy)")
        shape = list(value.shape) if isinstance(value, np.ndarray) else None
        out.append([list(where), "numpy", {"dtype": dtype.str, "shape": shape}])
        return value.tolist()
    if isinstance(value, enum.Enum):
        info = _type_info(type(value), where)
        inner = tagged(value.value, where, out)
        out.append([list(where), "enum", dict(info, member=value.name or "")])
        return inner
    if isinstance(value, type):
        out.append([list(where), "type", _type_info(value, where)])
        return None
    if isinstance(value, argparse.Namespace):
        attributes = {k: tagged(v, where + [k], out) for k, v in vars(value).items()}
        out.append([list(where), "namespace", {}])
        return attributes
    if isinstance(value, pathlib.PurePath):
        cls = next(c.__name__ for c in type(value).__mro__
                   if c.__module__ == "pathlib" and c.__name__ in _PATH_CLASSES)
        out.append([list(where), "path", {"class": cls}])
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        out.append([list(where), "bytes", {"class": type(value).__name__}])
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (set, frozenset)):
        try:
            elements = sorted(value)
        except TypeError:
            elements = list(value)
        members = [tagged(v, where + [i], out) for i, v in enumerate(elements)]
        out.append([list(where), "set", {"class": "frozenset" if isinstance(value, frozenset)
                                         else "set"}])
        return members
    if isinstance(value, (collections.Counter, collections.defaultdict)):
        pairs = [[tagged(k, where + [i, 0], out), tagged(v, where + [i, 1], out)]
                 for i, (k, v) in enumerate(value.items())]
        if isinstance(value, collections.Counter):
            out.append([list(where), "counter", {}])
            return pairs
        factory = value.default_factory
        if factory is not None and not isinstance(factory, type):
            raise TypeError(f"tsnap: cannot save the defaultdict at {_path_text(where)}: its "
                            f"default_factory {factory!r} is not a class")
        out.append([list(where), "defaultdict", {
            "factory": None if factory is None else _type_info(factory, where)}])
        return pairs
    oc = sys.modules.get("omegaconf")
    if oc is not None and isinstance(value, (oc.DictConfig, oc.ListConfig)):
        plain = oc.OmegaConf.to_container(value, resolve=False)
        inner = tagged(plain, where, out)
        out.append([list(where), "omegaconf", {"kind": type(value).__name__}])
        return inner
    if isinstance(value, dict):
        changed = False
        items: list[tuple[Any, Any]] = []
        for k, v in value.items():
            new = tagged(v, where + [k], out)
            changed = changed or new is not v
            items.append((k, new))
        if not changed:
            return value
        copy: dict[Any, Any] = (collections.OrderedDict(items)
                                if isinstance(value, collections.OrderedDict) else dict(items))
        meta = getattr(value, "_metadata", None)
        if meta is not None:
            copy._metadata = meta  # type: ignore[attr-defined]
        return copy
    if isinstance(value, (list, tuple)):
        new_items = [tagged(v, where + [i], out) for i, v in enumerate(value)]
        if all(a is b for a, b in zip(new_items, value)):
            return value
        return tuple(new_items) if isinstance(value, tuple) else new_items
    return value  # a plain value, or one that flatten refuses naming its key


def _allowed(import_types: ImportTypes, name: str) -> bool:
    if isinstance(import_types, bool):
        return import_types
    return name in import_types


def _resolve(info: Any, key: str, import_types: ImportTypes, target: str) -> Any:
    """The class ``info`` names: a builtin or a known class, else one ``import_types`` allows
    importing, else an Unresolved."""
    if (not isinstance(info, dict) or not isinstance(info.get("module"), str)
            or not isinstance(info.get("qualname"), str)):
        raise _error("bad_manifest", f"{target}: the class recorded at '{key}' is not valid")
    module, qualname = info["module"], info["qualname"]
    name = f"{module}.{qualname}"
    if module == "builtins":
        found = getattr(builtins, qualname, None)
        return found if isinstance(found, type) else Unresolved(
            "type", name, key, "not a builtin class")
    known = qualname in _KNOWN_TYPES.get(module, ())
    if not known and not _allowed(import_types, name):
        return Unresolved("type", name, key, "import_types does not allow it")
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception as e:  # an import runs the module's code: any error
        return Unresolved("type", name, key, f"importing it failed: {e}")
    if not isinstance(found, type):
        return Unresolved("type", name, key, "it is not a class")
    return found


def _restored(tag: str, node: Any, info: dict[str, Any], key: str, import_types: ImportTypes,
              target: str) -> Any:
    def bad(what: str) -> _C.Error:
        return _error("bad_manifest", f"{target}: the {tag} value at '{key}' is not valid: "
                      f"{what}")

    def pairs() -> list[tuple[Any, Any]]:
        if not isinstance(node, list) or not all(isinstance(p, list) and len(p) == 2
                                                 for p in node):
            raise bad("not a list of pairs")
        try:
            return [(k, v) for k, v in node if hash(k) is not None]
        except TypeError:
            raise bad("a key is not hashable") from None

    if tag == "namespace":
        if not isinstance(node, dict) or not all(isinstance(k, str) for k in node):
            raise bad("not a dict with str keys")
        return argparse.Namespace(**node)
    if tag == "path":
        cls = info.get("class")
        if not isinstance(node, str) or cls not in _PATH_CLASSES:
            raise bad("not a str and a pathlib class")
        try:
            return getattr(pathlib, cls)(node)
        except NotImplementedError:  # a WindowsPath on POSIX, or the reverse
            return pathlib.Path(node)
    if tag == "bytes":
        if not isinstance(node, str) or info.get("class") not in ("bytes", "bytearray"):
            raise bad("not base64 text")
        try:
            data = base64.b64decode(node.encode("ascii"), validate=True)
        except ValueError:
            raise bad("not base64 text") from None
        return data if info["class"] == "bytes" else bytearray(data)
    if tag == "set":
        if not isinstance(node, list) or info.get("class") not in ("set", "frozenset"):
            raise bad("not a list")
        try:
            return set(node) if info["class"] == "set" else frozenset(node)
        except TypeError:
            raise bad("an element is not hashable") from None
    if tag == "counter":
        return collections.Counter(dict(pairs()))
    if tag == "defaultdict":
        factory = info.get("factory")
        made = None if factory is None else _resolve(factory, key, import_types, target)
        return collections.defaultdict(made, pairs())
    if tag == "numpy":
        dtype, shape = info.get("dtype"), info.get("shape")
        if not isinstance(dtype, str) or not (shape is None or isinstance(shape, list)):
            raise bad("no dtype and shape")
        try:
            import numpy as np
        except ImportError:
            raise _error("unsupported", f"{target}: '{key}' holds a numpy value and numpy is "
                         "not installed") from None
        try:
            array = np.array(node, dtype=np.dtype(dtype))
            if shape is None:
                return array[()]
            return array.reshape(shape)
        except (TypeError, ValueError) as e:
            raise bad(str(e)) from None
    if tag == "enum":
        cls = _resolve(info, key, import_types, target)
        name = f"{info['module']}.{info['qualname']}"
        member = info.get("member")
        if not isinstance(member, str):
            raise bad("no member name")
        if isinstance(cls, Unresolved):
            return Unresolved("enum", name, key, cls.why, member, node)
        if not issubclass(cls, enum.Enum):
            return Unresolved("enum", name, key, "it is not an Enum", member, node)
        try:
            return cls[member]
        except KeyError:  # a combination of flags, or a renamed member: by value
            pass
        try:
            return cls(node)
        except (ValueError, TypeError):
            return Unresolved("enum", name, key, f"it has no member {member!r} or value "
                              f"{node!r}", member, node)
    if tag == "type":
        return _resolve(info, key, import_types, target)
    if tag == "omegaconf":
        try:
            from omegaconf import OmegaConf  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            warnings.warn(f"tsnap.lightning: {target}: '{key}' was an omegaconf "
                          f"{info.get('kind')}; omegaconf is not installed, so it is loaded as "
                          "a plain container", RuntimeWarning, stacklevel=4)
            return node
        return OmegaConf.create(node)
    raise _error("bad_manifest", f"{target}: unknown value tag {tag!r} at '{key}'")


def _replaced(node: Any, path: list[Any], fn: Callable[[Any], Any]) -> Any:
    """``node`` with the value at ``path`` replaced by ``fn(value)`` (tuples rebuilt)."""
    if not path:
        return fn(node)
    head, rest = path[0], path[1:]
    new = _replaced(node[head], rest, fn)
    if isinstance(node, tuple):
        return node[:head] + (new,) + node[head + 1:]
    node[head] = new
    return node


def restore_values(state: dict[Any, Any], record: dict[str, Any], target: str,
                   import_types: ImportTypes, record_key: str) -> dict[Any, Any]:
    """``state`` with the tagged values that ``record["values"]`` lists restored; raises
    tsnap.FormatError, naming ``target`` and the record ``record_key``, when it is not valid."""
    entries = record.get("values", [])
    if not isinstance(entries, list):
        raise _error("bad_manifest", f"{target}: its '{record_key}' record is not valid")
    for entry in entries:
        if (not isinstance(entry, list) or len(entry) != 3 or not isinstance(entry[0], list)
                or not entry[0] or not isinstance(entry[1], str)
                or not isinstance(entry[2], dict)):
            raise _error("bad_manifest", f"{target}: its '{record_key}' record is not valid")
        path, tag, info = entry
        key = SEP.join(map(str, path))
        def restore(node: Any, tag: str = tag, info: dict[str, Any] = info,
                    key: str = key) -> Any:
            return _restored(tag, node, info, key, import_types, target)
        try:
            state = _replaced(state, path, restore)
        except (KeyError, IndexError, TypeError):
            raise _error("bad_manifest", f"{target}: its '{record_key}' record names '{key}', "
                         "which the checkpoint does not hold") from None
    return state


def unresolved_in(value: Any, where: list[Any]) -> Unresolved | None:
    if isinstance(value, Unresolved):
        return value
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, collections.defaultdict) and isinstance(value.default_factory,
                                                                 Unresolved):
        return value.default_factory
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        found = unresolved_in(v, where + [k])
        if found is not None:
            return found
    return None
