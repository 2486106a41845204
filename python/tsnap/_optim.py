"""Optimizer state keyed by parameter name (as tsnap's C++ `tsnap::bind(opt, model)`).

``optimizer.state_dict()`` keys its per-parameter state by position (0, 1, ...), which breaks
when a model gains, loses or reorders parameters between save and resume. These two functions
translate it to and from the names of ``model.named_parameters()``.
"""

from __future__ import annotations

from typing import Any

import torch


def _names_by_position(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError("tsnap: the optimizer holds a parameter that is not one of "
                                 "model.named_parameters()")
            out.append(names[id(p)])
    return out


def optimizer_state_dict(optimizer: torch.optim.Optimizer,
                         model: torch.nn.Module) -> dict[str, Any]:
    """``optimizer.state_dict()`` with parameter names for positions: ``{"state": {name:
    {...}}, "param_groups": [{..., "params": [name, ...]}]}``."""
    sd = optimizer.state_dict()
    names = _names_by_position(optimizer, model)
    groups = []
    for group in sd["param_groups"]:
        g = dict(group)
        g["params"] = [names[i] for i in group["params"]]
        groups.append(g)
    return {"state": {names[i]: s for i, s in sd["state"].items()}, "param_groups": groups}


def load_optimizer_state_dict(optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                              named: dict[str, Any]) -> None:
    """Loads a state made by ``optimizer_state_dict`` into ``optimizer`` (whose parameters are
    ``model``'s). Raises ValueError naming a parameter the saved state does not know."""
    position = {n: i for i, n in enumerate(_names_by_position(optimizer, model))}
    groups = []
    for group in named["param_groups"]:
        g = dict(group)
        unknown = [n for n in group["params"] if n not in position]
        if unknown:
            raise ValueError(f"tsnap: saved optimizer state names parameters the model lacks: "
                             f"{unknown[:5]}")
        g["params"] = [position[n] for n in group["params"]]
        groups.append(g)
    state: dict[int, Any] = {}
    for n, s in named["state"].items():
        if n not in position:
            raise ValueError(f"tsnap: saved optimizer state for unknown parameter '{n}'")
        state[position[n]] = s
    optimizer.load_state_dict({"state": state, "param_groups": groups})
