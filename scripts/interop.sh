#!/usr/bin/env bash
# Format interoperability between the two LibTorch builds: a snapshot and a checkpoint written by
# the LibTorch 2.x build (build/) load exactly in the Debian 1.13 build (build-debian/), and back.
# Builds tsnap_interop in both (scripts/build.sh); see tests/interop/interop_main.cpp.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TSNAP_TORCH=wheel "$repo/scripts/build.sh" tsnap_interop
TSNAP_TORCH=debian "$repo/scripts/build.sh" tsnap_interop
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
wheel="$repo/build/tests/tsnap_interop"
debian="$repo/build-debian/tests/tsnap_interop"
"$wheel" write "$work/from-2x"
"$debian" check "$work/from-2x"
"$debian" write "$work/from-1.13"
"$wheel" check "$work/from-1.13"
echo "interop: ok"
