#!/usr/bin/env bash
# Lints and type-checks the Python package: ruff over python/ (the package and its tests) and
# mypy over python/tsnap, with the settings of pyproject.toml ([tool.ruff], [tool.mypy]; caches
# under .cache/). Installs what is missing first: the torch wheel in .venv
# (scripts/install-deps.sh; mypy reads torch's types), then the pinned ruff and mypy from PyPI
# into the same venv. Needs no build: the extension module's types are in python/tsnap/_C.pyi.
# About 12 s on the 2 shared cores (mypy reads torch's types); 1-2 s from mypy's cache.
set -euo pipefail

ruff_version=0.17.6
mypy_version=2.4.1

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TSNAP_TORCH=wheel "$repo/scripts/install-deps.sh"
venv="$repo/.venv"

if [[ "$("$venv/bin/ruff" --version 2>/dev/null || true)" != "ruff $ruff_version" ||
      "$("$venv/bin/mypy" --version 2>/dev/null || true)" != "mypy $mypy_version "* ]]; then
  echo "check-python: installing ruff==$ruff_version mypy==$mypy_version into $venv"
  "$venv/bin/pip" install --disable-pip-version-check --no-input -q \
    "ruff==$ruff_version" "mypy==$mypy_version"
fi

cd "$repo"
echo "check-python: ruff check python"
"$venv/bin/ruff" check python
echo "check-python: mypy (python/tsnap)"
"$venv/bin/mypy"
