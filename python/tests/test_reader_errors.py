"""Every reader error is a tsnap.Error: a manifest with any one byte flipped is refused (or,
where the flip leaves it valid, read) without another exception class, messages stay short,
and the stale-state check reports what it found."""

import json

import pytest
import torch

import tsnap


def _readers(path, dest):
    """The Python readers of a snapshot, each called on ``path``."""
    return {
        "load": lambda: tsnap.load(path),
        "metadata": lambda: tsnap.metadata(path),
        "verify": lambda: tsnap.verify(path),
        "load_into": lambda: tsnap.load_into(path, dest),
    }


def test_every_single_byte_flip_of_a_manifest_raises_only_tsnap_errors(tmp_path):
    state = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "é": torch.ones(2)}
    tsnap.save(tmp_path / "s", state, metadata={"note": "café"})
    manifest = tmp_path / "s" / "MANIFEST.json"
    original = manifest.read_bytes()
    dest = {k: torch.empty_like(v) for k, v in state.items()}
    accepted = 0
    step = max(1, len(original) // 200)  # about 200 flips spread over the whole file
    for offset in range(0, len(original), step):
        for bit in (0x01, 0x80):
            flipped = bytearray(original)
            flipped[offset] ^= bit
            manifest.write_bytes(bytes(flipped))
            for name, read in _readers(tmp_path / "s", dest).items():
                try:
                    read()
                except tsnap.Error:
                    continue
                except Exception as e:  # noqa: BLE001 (the point of the test)
                    pytest.fail(f"{name} raised {type(e).__name__} for a flip at byte {offset} "
                                f"(^{bit:#x}): {e}")
                accepted += 1
    manifest.write_bytes(original)
    # The checksum covers every byte before it, and the version requires it: a flip is refused
    # unless it lands in whitespace the JSON parser skips (none: tsnap writes none there).
    assert accepted == 0


def test_a_flip_in_the_checksum_key_is_refused(tmp_path):
    tsnap.save(tmp_path / "s", {"w": torch.ones(3)})
    manifest = tmp_path / "s" / "MANIFEST.json"
    text = manifest.read_bytes()
    at = text.rfind(b'"checksum"') + 1
    manifest.write_bytes(text[:at] + b"C" + text[at + 1:])
    with pytest.raises(tsnap.FormatError, match="checksum"):
        tsnap.load(tmp_path / "s")


def test_structure_record_messages_are_capped(tmp_path):
    tsnap.save(tmp_path / "s", {"a": torch.ones(2)})
    path = tmp_path / "s" / "MANIFEST.json"
    m = json.loads(path.read_text())
    m.pop("checksum")
    m["format_version"] = 2  # may lack the checksum: only the record's own checks object
    huge = "k" * (10 << 20)
    m["metadata"]["tsnap_python"] = {"d": [["a", {"t": huge}], ["b", {"t": huge}]]}
    path.write_text(json.dumps(m))
    with pytest.raises(tsnap.FormatError) as info:
        tsnap.load(tmp_path / "s")
    assert len(str(info.value)) < 2000
    assert info.value.code == "bad_manifest"


def test_stale_optimizer_moments_are_reported_and_refused_on_request(tmp_path):
    snap = tsnap.Snapshotter(tmp_path)
    moment = torch.zeros(64)

    def state(step):
        return {"model": {"w": torch.full((64,), float(step))},
                "optim": {"state": {"0": {"exp_avg": moment}}}}

    moment.fill_(1.0)
    snap.save_async("s1", state(1), step=1, must_change=["*/exp_avg"]).wait()
    h = snap.save_async("s2", state(2), step=2, must_change=["*/exp_avg"])
    h.wait()
    stats = h.stats
    assert stats.unchanged_since == "s1"
    assert stats.stale == ["optim/state/0/exp_avg"]
    with pytest.raises(tsnap.Error, match="stale") as info:
        snap.save_async("s3", state(3), step=3, must_change=["*/exp_avg"],
                        fail_if_stale=True).wait()
    assert info.value.code == "stale"
    assert not (tmp_path / "s3").exists()
    snap.close()
