#!/usr/bin/env bash
# Installs the Debian 12 packages that tsnap needs to build, test, run its example and plot its
# benchmarks. Idempotent: when every package is already installed it does nothing (no apt-get
# update). Runs apt-get as root, through sudo when not root.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config ccache python3 gnuplot-nox
  libtorch-dev libboost-dev libtbb-dev liburing-dev libgtest-dev nlohmann-json3-dev
  libxxhash-dev libcli11-dev libbenchmark-dev
)

missing=()
for package in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)"
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

if ((EUID == 0)); then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or install sudo) to install them" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update
"${as_root[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
