"""``python -m tsnap.bench --loop`` runs end to end on a tiny state and reports what it says."""

import math
import os

from tsnap.bench import _loop as bench_loop


def test_loop_benchmark_reports_paired_overhead_and_cleans_up(tmp_path):
    for staging in ("eager", "lazy", "copy"):
        r = bench_loop.run(size_mb=4, pairs=4, block=2, staging=staging,
                            workdir=str(tmp_path / staging))
        assert r["pairs"] == 4 and r["block_steps"] == 2 and r["state_mb"] > 3
        lo, hi = r["overhead_ci"]
        assert lo <= r["overhead"] <= hi and all(math.isfinite(v) for v in (lo, hi))
        assert r["stall_s"] > 0 and r["block_s"] > 0
        want = {"eager": r["stall_s"] / r["block_s"] + 0.01, "lazy": 0.01}.get(staging)
        assert r["target"] == want
        assert "overhead of one snapshot per block" in bench_loop.report(r)
        if os.path.exists("/proc/self/task"):  # tsnap's threads, by name
            own = r["tsnap_cpu_s_per_snapshot"]
            assert own is not None and "of tsnap's threads" in bench_loop.report(r)
            if staging == "copy":
                assert abs(own) < 0.005  # no tsnap thread has work
            else:
                assert own > 0  # each snapshot's writes, hashes and commit
        if staging == "copy":  # no snapshot at all: the floor of a background copy
            assert not os.path.exists(tmp_path / staging)
            assert "floor" in bench_loop.report(r)
            continue
        # Only the warm-up snapshot stays: each measured one is removed once committed.
        assert sorted(os.listdir(tmp_path / staging)) == ["warm-up"]
