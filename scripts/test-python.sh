#!/usr/bin/env bash
# Builds and installs the tsnap Python package into .venv (pip install . against the torch
# installed there, without build isolation: no second torch is downloaded; the CMake build in
# build/py is kept, so a reinstall recompiles only what changed) and runs its pytest suite
# (python/tests). Installs what is missing first: the Debian packages and the torch wheel
# (scripts/install-deps.sh), then scikit-build-core, pybind11, pytest, safetensors, numpy,
# psutil, lightning, accelerate and transformers (pinned: lightning_version, accelerate_version,
# transformers_version) from PyPI. Extra arguments go to pytest (e.g.
# -k periodic). Wheel LibTorch only: the Debian LibTorch 1.13 build is not involved. Times on
# the 2 shared cores: a fresh clone 11 min (the library's objects, partly from ccache, and the
# module), a reinstall after a change to the binding about 2 min, to Python files only about
# 15 s; the tests about 2 min 10 s (the multi-rank, example and trainer tests most of it;
# -m 'not dist' skips the multi-rank ones).
set -euo pipefail

# The Lightning release tsnap.lightning is tested with (python/tests/test_lightning.py).
lightning_version=2.6.6
# The accelerate and transformers releases tsnap.accelerate and tsnap.transformers are tested with
# (python/tests/test_accelerate.py, test_transformers.py).
accelerate_version=1.16.0
transformers_version=5.25.0

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TSNAP_TORCH=wheel "$repo/scripts/install-deps.sh"
py="$repo/.venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check --no-input)

"$repo/scripts/pip-ensure.sh" "$py" scikit_build_core:scikit-build-core pybind11:pybind11 \
  pytest:pytest safetensors:safetensors numpy:numpy psutil:psutil \
  "lightning:lightning==$lightning_version" "accelerate:accelerate==$accelerate_version" \
  "transformers:transformers==$transformers_version"

echo "test-python: building and installing the package (build/py)"
"${pip[@]}" install --no-build-isolation --no-deps -q "$repo"
cd "$repo"
"$py" -m pytest -q python/tests "$@"
