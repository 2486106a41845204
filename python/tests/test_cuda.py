"""GPU state (marker ``cuda``; every test skips without a CUDA device; scripts/device-check.sh
runs them on a GPU machine): save_async of CUDA tensors holds their values as of the call (fp32,
and bf16 converted on the device), load_into writes CUDA destinations bit for bit as it writes
CPU ones, and a single-rank NCCL job snapshots through a DistGroup while its own collectives
run."""

import os
import subprocess
import sys

import pytest
import torch

import tsnap

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def bits(t):
    return t.detach().reshape(-1).view(torch.uint8).cpu()


def assert_bitwise(a, b, what=""):
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert torch.equal(bits(a), bits(b)), what


def gpu_state(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    model = {"w": torch.randn(1000, 1000, device="cuda", generator=g),  # 4 MB: several chunks
             "t": torch.randn(300, 500, device="cuda", generator=g).t(),  # not contiguous
             "h": torch.randn(777, device="cuda", generator=g).half()}
    optim = {"state": {0: {"step": torch.tensor(7.0),  # on the CPU, as torch.optim keeps it
                           "exp_avg": torch.randn(1000, 1000, device="cuda", generator=g),
                           "exp_avg_sq": torch.rand(1000, 1000, device="cuda", generator=g)}},
             "ids": torch.randint(0, 1000, (12345,), device="cuda", generator=g)}
    return {"model": model, "optim": optim}


def leaves(state, prefix=""):
    out = {}
    for k, v in state.items():
        key = f"{prefix}{k}"
        out.update(leaves(v, key + "/") if isinstance(v, dict) else {key: v})
    return out


def scramble(state):
    """Changes every tensor of ``state`` in place, on its device's current stream."""
    for t in leaves(state).values():
        if t.dtype.is_floating_point:
            t.mul_(-2).add_(1)
        else:
            t.add_(1)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("staging", ["eager", "lazy"])
def test_save_async_of_cuda_tensors_holds_the_values_at_the_call(tmp_path, dtype, staging):
    state = gpu_state()
    want = {k: (v.to(dtype) if dtype is not None and v.dim() > 0 and v.is_floating_point()
                else v).cpu().contiguous() for k, v in leaves(state).items()}
    snap = tsnap.Snapshotter(tmp_path, chunk_bytes=1 << 20, staging_budget=4 << 20)
    h = snap.save_async("s", state, dtype=dtype, staging=staging)
    if staging == "lazy":
        h.wait_staged()
    scramble(state)  # training goes on at once
    h.wait()
    snap.close()
    back = leaves(tsnap.load(tmp_path / "s"))
    assert sorted(back) == sorted(want)
    for k in want:
        assert_bitwise(back[k], want[k], k)


def test_load_into_cuda_tensors_matches_the_cpu_load(tmp_path):
    state = gpu_state(1)
    tsnap.save(tmp_path / "s", state)
    cpu = {"model": {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in state["model"].items()}}
    tsnap.load_into(tmp_path / "s", cpu)
    dest = {"model": {k: torch.full(v.shape, 3, dtype=v.dtype, device="cuda")
                      for k, v in state["model"].items()}}
    dest["model"]["t"] = torch.zeros(300, 500, device="cuda").t()  # not contiguous
    before = {k: v.data_ptr() for k, v in dest["model"].items()}
    report = tsnap.load_into(tmp_path / "s", dest)
    assert sorted(report["loaded"]) == ["model/h", "model/t", "model/w"]
    for k, v in dest["model"].items():
        assert v.is_cuda and v.data_ptr() == before[k], k  # in place
        assert_bitwise(v, cpu["model"][k], k)
        assert_bitwise(v, state["model"][k], k)


def test_load_into_cuda_converts_bf16_on_disk_into_fp32_as_the_cpu(tmp_path):
    state = gpu_state(2)
    tsnap.save(tmp_path / "s", state, dtype=torch.bfloat16)
    shapes = {k: (v.shape, v.dtype) for k, v in leaves(state).items()}
    cpu = {k: torch.zeros(s, dtype=d) for k, (s, d) in shapes.items()}
    gpu = {k: torch.ones(s, dtype=d, device="cuda") for k, (s, d) in shapes.items()}
    gpu["optim/state/0/step"] = torch.zeros(())  # a CPU destination beside GPU ones
    tsnap.load_into(tmp_path / "s", cpu)
    tsnap.load_into(tmp_path / "s", gpu)
    for k in shapes:
        assert_bitwise(gpu[k], cpu[k], k)
    w = leaves(state)["model/w"]
    assert gpu["model/w"].dtype == torch.float32
    assert_bitwise(gpu["model/w"], w.to(torch.bfloat16).float(), "model/w")


def test_load_into_cuda_waits_for_the_current_stream_and_is_done_on_return(tmp_path):
    want = torch.randn(4 << 20)
    tsnap.save(tmp_path / "s", {"w": want})
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        dest = torch.empty(4 << 20, device="cuda")
        m = torch.randn(4096, 4096, device="cuda")
        for _ in range(8):  # a long kernel queue before the write below
            m = (m @ m).div_(64)
        dest.fill_(5)
        tsnap.load_into(tmp_path / "s", {"w": dest})
        assert_bitwise(dest, want)  # no synchronize needed


def test_failed_load_leaves_cuda_destinations_unwritten(tmp_path):
    tsnap.save(tmp_path / "s", {"a": torch.randn(1 << 20), "b": torch.randn(1 << 20)},
               num_shards=1)
    shard = next(p for p in (tmp_path / "s").iterdir() if p.suffix == ".safetensors")
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size - 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    dest = {"a": torch.full((1 << 20,), 7.0, device="cuda"),
            "b": torch.full((1 << 20,), 7.0, device="cuda")}
    with pytest.raises(tsnap.FormatError) as e:
        tsnap.load_into(tmp_path / "s", dest)
    assert "already written" not in str(e.value) or "no destination tensor" in str(e.value)
    for k, v in dest.items():
        assert torch.equal(v.cpu(), torch.full((1 << 20,), 7.0)), k
    # Shapes are checked before anything is read: nothing changes either.
    wrong = {"a": torch.full((5,), 7.0, device="cuda")}
    with pytest.raises(tsnap.InvalidArgument):
        tsnap.load_into(tmp_path / "s", wrong, verify=False)
    assert torch.equal(wrong["a"].cpu(), torch.full((5,), 7.0))


def test_training_state_round_trip_on_the_gpu(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64, device="cuda")
    for _ in range(3):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    tsnap.save(tmp_path / "s", {"model": model.state_dict(), "optim": opt.state_dict()},
               dtype=torch.bfloat16, dtype_rules={"optim/*": None})
    other = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 8)).cuda()
    tsnap.load_into(tmp_path / "s", {"model": other.state_dict()})
    for (k, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert_bitwise(b, a.to(torch.bfloat16).float(), k)
    back = tsnap.load(tmp_path / "s")
    for k, s in opt.state_dict()["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert_bitwise(back["optim"]["state"][k][name], s[name].cpu(), f"{k}/{name}")


NCCL_RANK = r"""
import os, sys
import torch, torch.distributed as dist
import tsnap
root = sys.argv[1]
torch.cuda.set_device(0)
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                        device_id=torch.device("cuda", 0))
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
mesh = init_device_mesh("cuda", (1,))
torch.manual_seed(0)
model = torch.nn.Linear(512, 512).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(64, 512, device="cuda")
group = tsnap.DistGroup(timeout=60)
snap = tsnap.Snapshotter(root, group=group)
saved = []
for step in range(6):
    opt.zero_grad()
    model(x).square().mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # the training's own collectives, on NCCL
    opt.step()
    if step % 2 == 1:
        state = {"model": model.state_dict(), "optim": opt.state_dict(),
                 "rows": distribute_tensor(model.weight.detach().clone(), mesh, [Shard(0)])}
        want = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        saved.append((f"s{step}", snap.save_async(f"s{step}", state), want))
for name, handle, want in saved:
    handle.wait()
    back = tsnap.load(os.path.join(root, name))
    for k, v in want.items():
        assert torch.equal(back["model"][k], v), (name, k)
    assert torch.equal(back["rows"], want["weight"]), name
dest = {"model": torch.nn.Linear(512, 512).cuda().state_dict()}
tsnap.load_into(os.path.join(root, saved[-1][0]), dest)
for k, v in saved[-1][2].items():
    assert torch.equal(dest["model"][k].cpu(), v), k
snap.close()
dist.barrier()
dist.destroy_process_group()
print("nccl rank ok")
"""


def test_single_rank_nccl_job_snapshots_beside_its_collectives(tmp_path):
    r = subprocess.run([sys.executable, "-c", NCCL_RANK, str(tmp_path / "root")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "nccl rank ok" in r.stdout, r.stdout + r.stderr[-4000:]
