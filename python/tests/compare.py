"""Comparisons the Python suite's tests share: tensors bit for bit, nested states value by value."""

import collections
import math

import torch


def bits_equal(a, b):
    """Whether tensors ``a`` and ``b`` have one dtype and shape and the same bytes (NaN == NaN)."""
    assert isinstance(b, torch.Tensor), type(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def assert_same(a, b, where="state", *, types=False):
    """Asserts that nested states ``a`` and ``b`` hold equal values, tensors bit for bit; with
    ``types``, also of equal types in the same order (OrderedDict vs dict, tuple vs list, int vs
    float, the order of a dict's keys). ``where`` names the place in failures."""
    if isinstance(a, torch.Tensor):
        assert bits_equal(a, b), where
        return
    if isinstance(a, dict):
        assert isinstance(b, dict), (where, type(a), type(b))
        if types:
            assert isinstance(a, collections.OrderedDict) == isinstance(
                b, collections.OrderedDict), (where, type(a), type(b))
            assert list(a) == list(b), (where, set(a) ^ set(b))
        else:
            assert set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}", types=types)
        return
    if types:
        assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}/{i}", types=types)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, (where, a, b)
