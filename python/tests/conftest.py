"""pytest configuration of the tsnap Python suite, and the fixtures its modules share."""

import subprocess

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "dist: multi-process tests (2 and 4 ranks, Gloo on CPU); -m 'not dist' skips")
    config.addinivalue_line(
        "markers", "cuda: needs a CUDA device (skips without one); scripts/device-check.sh runs "
        "them on a GPU machine")


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MiB tmpfs (a disk that fills up), or a skip where mounting one is not allowed."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
