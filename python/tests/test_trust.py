"""Resumes that never silently diverge: the precision rule, the structure record's checks,
forked processes and Ctrl-C (scripts/test-python.sh runs it)."""

import json
import multiprocessing
import os
import signal
import time

import pytest
import torch

import tsnap


def _train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        loss = (model(x) - x[:, :4]).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _make(kind):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    return model, cls(model.parameters(), lr=1e-3)


def _counter(key, value):
    return value.dim() == 0 or key.rsplit("/", 1)[-1] == "step"


@pytest.mark.parametrize("kind", ["adam", "adamw"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_snapshot_keeps_the_step_and_resumes_like_converted_fp32(tmp_path, kind,
                                                                              dtype):
    model, opt = _make(kind)
    _train(model, opt, 2100, seed=1)  # past 2048: a 16-bit float no longer counts by ones
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    tsnap.save(tmp_path / "low", state, dtype=dtype)
    tsnap.save(tmp_path / "full", state)

    low = tsnap.load(tmp_path / "low")
    full = tsnap.load(tmp_path / "full")
    for s in low["optim"]["state"].values():
        assert s["step"].dtype == torch.float32 and s["step"].item() == 2100.0
        assert s["exp_avg"].dtype == dtype
    # The fp32 snapshot with its weights and moments converted the same way.
    flat_low = tsnap.load(tmp_path / "low", flat=True)
    for key, t in tsnap.load(tmp_path / "full", flat=True).items():
        assert flat_low[key].dtype == (t.dtype if _counter(key, t) else dtype), key

    def resumed(saved):
        m, o = _make(kind)
        m.load_state_dict({k: v.float() for k, v in saved["model"].items()})
        o.load_state_dict(saved["optim"])
        return m, o, _train(m, o, 10, seed=2)

    def converted(s):
        if isinstance(s, dict):
            return {k: (v.to(dtype).float() if isinstance(v, torch.Tensor) and v.dim() > 0
                        and k != "step" else converted(v)) for k, v in s.items()}
        if isinstance(s, list):
            return [converted(v) for v in s]
        return s

    m_low, o_low, losses_low = resumed(low)
    m_ref, o_ref, losses_ref = resumed(converted(full))
    assert losses_low == losses_ref
    for s in o_low.state.values():
        assert s["step"].item() == 2110.0
    for a, b in zip(m_low.parameters(), m_ref.parameters()):
        assert torch.equal(a, b)


def test_dtype_rules_refine_the_dtype_per_key(tmp_path):
    model, opt = _make("adamw")
    _train(model, opt, 3, seed=1)
    tsnap.save(tmp_path / "s", {"model": model.state_dict(), "optim": opt.state_dict()},
               dtype=torch.bfloat16,
               dtype_rules={"*/exp_avg_sq": torch.float32, "model/bias": None})
    m = json.loads((tmp_path / "s" / "MANIFEST.json").read_text())["tensors"]
    assert m["optim/state/0/exp_avg_sq"]["dtype"] == "F32"
    assert m["optim/state/0/exp_avg"]["dtype"] == "BF16"
    assert m["optim/state/0/step"]["dtype"] == "F32"
    assert m["model/bias"]["dtype"] == "F32"
    assert m["model/weight"]["dtype"] == "BF16"
    with pytest.raises(TypeError):
        tsnap.save(tmp_path / "t", {"w": torch.ones(3)}, dtype_rules=[("*", torch.float16)])
    with pytest.raises(tsnap.InvalidArgument):
        tsnap.save(tmp_path / "u", {"w": torch.ones(3)}, dtype_rules={"*": torch.int32})


def _rewrite_tree(path, tree):
    """Replaces the structure record and drops the manifest's checksum, writing it as a
    version-2 manifest (which may lack one), so that only the record's own checks can object."""
    text = (path / "MANIFEST.json").read_text()
    m = json.loads(text)
    m.pop("checksum", None)
    m["format_version"] = 2
    m["metadata"]["tsnap_python"] = tree
    (path / "MANIFEST.json").write_text(json.dumps(m))


@pytest.mark.parametrize("tree", [
    {"d": []},                                              # names none of the tensors
    {"dt": "load"},                                         # a function, not a dtype
    {"d": [["a", {"t": "a"}], ["b", {"t": "a"}]]},          # a key named twice
    {"d": [["a", {"t": "a"}], ["b", {"t": "b"}], ["c", {"t": "zz"}]]},  # a key not there
    {"d": [["a", {"t": "a"}], ["b", {"x": 1}]]},            # an unknown node
    {"d": [["a", {"t": "a"}], ["b", {"t": "b", "l": []}]]},  # two kinds at once
    {"d": [["a", {"t": "a"}], [1.5, {"t": "b"}]]},          # a float dict key
    [1, 2, 3],                                              # not an object
])
def test_a_tampered_structure_record_raises_format_error(tmp_path, tree):
    tsnap.save(tmp_path / "s", {"a": torch.ones(2), "b": torch.zeros(3)})
    _rewrite_tree(tmp_path / "s", tree)
    with pytest.raises(tsnap.FormatError, match="structure record"):
        tsnap.load(tmp_path / "s")


def test_a_flipped_manifest_field_is_caught_by_its_checksum(tmp_path):
    tsnap.save(tmp_path / "s", {"a": torch.ones(2)}, metadata={"step": 5})
    path = tmp_path / "s" / "MANIFEST.json"
    text = path.read_text()
    path.write_text(text.replace('"step":5', '"step":6'))
    with pytest.raises(tsnap.FormatError, match="checksum"):
        tsnap.load(tmp_path / "s")


def test_an_empty_key_part_is_named(tmp_path):
    with pytest.raises(ValueError, match="empty key"):
        tsnap.save(tmp_path / "s", {"": torch.ones(2)})
    with pytest.raises(ValueError, match="empty key"):
        tsnap.save(tmp_path / "s", {"model": {"": torch.ones(2)}})
    with pytest.raises(TypeError, match="must be a dict"):
        tsnap.save(tmp_path / "s", torch.ones(2))


def _child_saves(queue):
    # The Snapshotter was made by the parent; this process is a fork of it.
    snap = _child_saves.snap
    try:
        snap.save_async("child", {"w": torch.ones(4)})
        queue.put("saved")
    except tsnap.Error as e:
        queue.put(f"{e.code}: {e}")
    snap.close()  # must not wait for the parent's threads, which are not here


def test_a_forked_child_gets_a_clear_error_and_exits(tmp_path):
    ctx = multiprocessing.get_context("fork")
    snap = tsnap.Snapshotter(tmp_path)
    snap.save_async("parent", {"w": torch.ones(4)}).wait()
    _child_saves.snap = snap
    queue = ctx.Queue()
    p = ctx.Process(target=_child_saves, args=(queue,))
    p.start()
    p.join(30)
    assert not p.is_alive(), "the forked child hung"
    assert p.exitcode == 0
    said = queue.get(timeout=5)
    assert said.startswith("unsupported: "), said
    assert "forked" in said
    snap.save_async("after", {"w": torch.ones(4)}).wait()  # the parent's is intact
    snap.close()
    assert sorted(os.listdir(tmp_path)) == ["after", "parent"]


def test_sigint_takes_a_final_snapshot_then_raises_keyboard_interrupt(tmp_path):
    model, opt = _make("adamw")
    before = signal.getsignal(signal.SIGINT)
    snap = tsnap.Snapshotter(tmp_path)
    hook = tsnap.PeriodicSnapshots(snap, lambda: {"model": model.state_dict()},
                                   every_steps=1000, on_signals=[signal.SIGINT], log=False)
    step = 0
    with pytest.raises(KeyboardInterrupt):
        while step < 200:
            _train(model, opt, 1, seed=step)
            time.sleep(0.005)
            step += 1
            if step == 7:
                signal.raise_signal(signal.SIGINT)  # Ctrl-C in the middle of the loop
            hook.after_step(step)
    assert 7 <= step < 100, step  # at the end of the step that saw it
    assert hook.stop_signal == signal.SIGINT
    hook.close()
    assert tsnap.latest(tmp_path).endswith(f"step-{step:08d}")
    assert signal.getsignal(signal.SIGINT) is before
    snap.close()
