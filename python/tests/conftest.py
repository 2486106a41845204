"""pytest configuration of the tsnap Python suite."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "dist: multi-process tests (2 and 4 ranks, Gloo on CPU); -m 'not dist' skips")
    config.addinivalue_line(
        "markers", "cuda: needs a CUDA device (skips without one); scripts/device-check.sh runs "
        "them on a GPU machine")
