"""``python -m tsnap.bench --cuda``: without a GPU it says so and exits cleanly; its
measurements run end to end on a tiny state (on the CPU everywhere, on the GPU where there is
one) and its table reads them."""

import math
import os
import subprocess
import sys

import pytest
import torch

from tsnap.bench import _cuda as bench_cuda

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")])]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_says_so_and_exits_cleanly(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tsnap.bench", "--cuda", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "no CUDA device is available here" in r.stdout
    assert "Traceback" not in r.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("device", DEVICES)
def test_measures_every_row_and_cleans_up(tmp_path, device):
    r = bench_cuda.run(scale=0.002, repeat=2, workdir=str(tmp_path), device=device, loop_mb=4,
                        loop_batch=8, pairs=2, block=2)
    assert r["bytes"] > 1e6 and r["bytes_bf16"] < r["bytes"]
    for key in ("stall", "durable", "stall_bf16", "durable_bf16", "floor", "floor_bf16",
                "raw_durable", "load", "raw_load"):
        assert math.isfinite(r[key]) and r[key] > 0, key
    assert r["stall"] < r["durable"] and r["engine"] and r["load_engine"]
    assert [loop["staging"] for loop in r["loop"]] == ["eager", "lazy"]
    assert all(loop["device"].startswith(device) for loop in r["loop"])
    text = bench_cuda.table(r)
    assert "stall, fp32 (target <= 1.1x)" in text and "load_into GPU tensors" in text
    assert text.count("overhead of one snapshot per block") == 2
    assert os.listdir(tmp_path) == []  # the working directory is gone


def test_pinned_floor_copies_the_bytes():
    tensors = [torch.randn(100), torch.arange(7), torch.randn(3, 5).t()]
    floor = bench_cuda.Pinned(tensors)
    assert floor.down() >= 0
    for v, t in zip(floor.views, tensors):
        assert torch.equal(v, t)
    half = bench_cuda.Pinned(tensors, torch.bfloat16)
    half.down()
    assert torch.equal(half.views[0], tensors[0].to(torch.bfloat16))
    assert half.views[1].dtype == torch.int64 and torch.equal(half.views[1], tensors[1])
