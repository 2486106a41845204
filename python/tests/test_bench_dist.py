"""``python -m tsnap.bench --ranks 2`` at a tiny scale (marker ``dist``): every row is there,
every save and restore ran, and the restores are bitwise. A smoke test, not a measurement."""

import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.dist


def test_bench_ranks_2_has_every_row(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "tsnap.bench", "--ranks", "2", "--scale", "0.0005", "--reps",
           "1", "--reuse-ranks", "--timeout", "60", "--dir", str(tmp_path), "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["ranks"] == 2 and report["reps"] == 1
    methods = ["tsnap", "dcp.save", "dcp.async", "dcp.async.reused", "dcp.async.stager"]
    if torch.cuda.is_available():
        methods += ["dcp.async.cached", "dcp.async.pinned"]
    rows = {(row["layout"], row["method"]): row for row in report["rows"]}
    assert sorted(rows) == sorted((lay, m) for lay in ("replicated", "sharded") for m in methods)
    for key, row in rows.items():
        assert "error" not in row, (key, row.get("error"))
        assert len(row["ranks"]) == 2, key
        s = row["summary"]
        assert s["stall_first_s"] > 0 and s["durable_s"]["median"] > 0, key
        assert s["stall_over_memcpy_held"]["first"] > 0, key
        assert all(w > 0 for w in s["written_per_rank"]), key
    # Replicated tensors are written once: each rank writes a part, together about the state.
    for layout in ("replicated", "sharded"):
        ts = rows[(layout, "tsnap")]["summary"]
        assert sum(ts["written_per_rank"]) >= report["global_bytes"], layout
    for m in ("dcp.async", "dcp.async.reused", "dcp.async.stager"):
        assert report["durable_ratio_dcp_async_over_tsnap"][f"replicated/{m}"] > 0
    restores = {(x["layout"], x["format"]): x for x in report["restore"]}
    assert sorted(restores) == sorted((lay, f) for lay in ("replicated", "sharded")
                                      for f in ("tsnap", "dcp"))
    for key, x in restores.items():
        assert "error" not in x, (key, x.get("error"))
        assert x["loaded_by"] == 1 and x["bitwise"] is True and x["seconds"] > 0, key
    assert "row-sharded" in r.stdout and "restore on 1 process" in r.stdout
