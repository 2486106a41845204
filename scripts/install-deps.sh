#!/usr/bin/env bash
# Installs what tsnap needs to build, test, run its example and plot its benchmarks:
#  - Debian 12 packages (TBB, Boost, liburing, xxHash, nlohmann-json, CLI11, GoogleTest, Google
#    Benchmark, CMake, Ninja, g++, ccache, gnuplot, Python's venv; clang 14, clang-format and
#    clang-tidy (scripts/check-style.sh) and its sanitizer and
#    libFuzzer runtimes for scripts/sanitize.sh and scripts/fuzz.sh; Gloo's headers, which
#    LibTorch's ProcessGroupGloo header needs and neither LibTorch ships, for the distributed
#    tests and example; libcurl and OpenSSL for the S3 client);
#  - the local S3 server of the object-storage tests (scripts/s3-server.sh install: moto from
#    PyPI in a virtual environment at .venv-s3/, ignored by git), for every TSNAP_TORCH;
#  - LibTorch, chosen by TSNAP_TORCH:
#      wheel  (default) LibTorch 2.x from the `torch` wheel on PyPI (version TSNAP_TORCH_VERSION),
#             in a virtual environment at .venv/ (ignored by git), which CMake finds by itself;
#      debian Debian's libtorch-dev (1.13);
#      both   the two (what CI builds and tests).
# Idempotent and offline once done: when everything is present it installs nothing (no apt-get
# update, no pip). Runs apt-get as root, through sudo when not root.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
torch_kind="${TSNAP_TORCH:-wheel}"
torch_version="${TSNAP_TORCH_VERSION:-2.15.0}"
case "$torch_kind" in
  wheel | debian | both) ;;
  *) echo "install-deps: TSNAP_TORCH must be wheel, debian or both, not '$torch_kind'" >&2; exit 2 ;;
esac

packages=(
  cmake ninja-build g++ pkg-config ccache python3 python3-venv gnuplot-nox clang-14 libclang-rt-14-dev
  clang-format-14 clang-tidy-14
  libboost-dev libtbb-dev liburing-dev libgtest-dev nlohmann-json3-dev
  libxxhash-dev libcli11-dev libbenchmark-dev libgloo-dev libcurl4-openssl-dev libssl-dev
)
if [[ "$torch_kind" != wheel ]]; then
  packages+=(libtorch-dev)
fi

missing=()
for package in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)"
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} Debian packages already installed"
else
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
fi

"$repo/scripts/s3-server.sh" install

if [[ "$torch_kind" == debian ]]; then
  exit 0
fi

# The torch wheel, pinned, in .venv/ (Debian's Python: the one every Debian 12 machine has).
venv="$repo/.venv"
python=/usr/bin/python3
installed="$("$venv/bin/python" - 2>/dev/null <<'EOF' || true
import importlib.metadata as m
print(m.version("torch"))
EOF
)"
if [[ "${installed%%+*}" == "$torch_version" ]]; then
  echo "install-deps: torch $installed already in $venv"
  exit 0
fi
if [[ ! -x "$venv/bin/python" ]]; then
  echo "install-deps: creating $venv"
  "$python" -m venv "$venv"
fi
echo "install-deps: installing torch==$torch_version into $venv (about 5 GB with its CUDA libraries)"
"$venv/bin/pip" install --disable-pip-version-check --no-input "torch==$torch_version"
