#!/usr/bin/env bash
# Checks the binary wheel the way a user gets it: builds it (scripts/build-wheel.sh), creates a
# virtual environment that holds only the pinned torch and what torch requires
# (scripts/torch_only_venv.py, build/wheel/venv), installs the wheel there with pip (no
# compiler, no build), and then:
#   - every library that the installed ELF files load (ldd) comes from that environment or is one
#     that manylinux lets a wheel take from the system (auditwheel's policy for the wheel's tag):
#     nothing from the build machine's development packages;
#   - `tsnap --version`, `tsnap verify` and `tsnap bench` (tsnap-torch) run from the console
#     script;
#   - the pytest suite (python/tests) passes against the installed wheel, with the suite's own
#     tools (pytest, safetensors, numpy, psutil) added from PyPI; the trainers' tests skip, their
#     frameworks being absent;
#   - a C++ program (tests/packaging/consumer) builds with find_package(tsnap) pointed at
#     tsnap.cmake_prefix_path and LibTorch at torch.utils.cmake_prefix_path, with /usr ignored by
#     CMake's searches, and runs. Building it needs CMake and a compiler, as any C++ program.
# Extra arguments go to pytest. 5 min on 2 cores in CI (a fresh clone, after
# scripts/test-python.sh), the wheel's build included.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/build-wheel.sh"
wheel=("$repo"/dist/tsnap-*.whl)
work="$repo/build/wheel"
venv="$work/venv"
vpy="$venv/bin/python"

echo "test-wheel: a fresh environment with only torch ($venv)"
"$repo/.venv/bin/python" "$repo/scripts/torch_only_venv.py" "$venv"
"$vpy" -m pip --disable-pip-version-check --no-input install -q "${wheel[0]}"
"$vpy" -m pip --disable-pip-version-check --no-input install -q pytest safetensors numpy psutil

echo "test-wheel: what the installed files load"
site="$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
tag="$(basename "${wheel[0]}" .whl)"
tag="${tag##*-}"
"$repo/.venv/bin/python" - "$venv" "$site" "$tag" <<'EOF'
import json, os, pathlib, subprocess, sys
import auditwheel
venv, site, tag = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]), sys.argv[3]
policies = json.loads((pathlib.Path(auditwheel.__file__).parent / "policy" /
                       "manylinux-policy.json").read_text())
name = tag.split(".")[0].replace("_x86_64", "")
allowed = set(next(p for p in policies if p["name"] == name)["lib_whitelist"])
# LibTorch comes from the torch package; tsnap's library finds it through the consumer.
env = dict(os.environ, LD_LIBRARY_PATH=str(site / "torch" / "lib"))
files = [p for d in ("tsnap", "tsnap.libs") for p in (site / d).rglob("*")
         if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
bad = []
for path in files:
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env=env).stdout
    for line in out.splitlines():
        parts = line.split()
        if "=>" not in parts:
            continue  # the vdso and the loader
        lib, target = parts[0], parts[parts.index("=>") + 1]
        if target == "not":
            bad.append(f"{path.name}: {lib} not found")
        elif not pathlib.Path(target).resolve().is_relative_to(venv) and lib not in allowed:
            bad.append(f"{path.name}: {lib} from {target}")
print(f"test-wheel: {len(files)} ELF files checked against {name}")
if bad:
    sys.exit("test-wheel: libraries from outside the environment:\n  " + "\n  ".join(sorted(set(bad))))
EOF

echo "test-wheel: the command-line tool"
tool="$venv/bin/tsnap"
"$tool" --version
snap="$work/cli-check"
rm -rf "$snap"
"$vpy" -c "import sys, torch, tsnap; tsnap.save(sys.argv[1], {'w': torch.arange(10.0)})" "$snap/s"
"$tool" verify "$snap/s"
"$tool" bench --size 0.01 --reps 1 --no-torch --dir "$snap/bench" >/dev/null

echo "test-wheel: the pytest suite against the installed wheel"
(cd "$repo" && "$vpy" -c 'import tsnap, sys; print("test-wheel: tsnap from", tsnap.__file__)' &&
 "$vpy" -m pytest -q -p no:cacheprovider python/tests "$@")

echo "test-wheel: a C++ program against the wheel's C++ package"
prefix="$("$vpy" -c 'import torch, tsnap; print(torch.utils.cmake_prefix_path + ";" + tsnap.cmake_prefix_path)')"
launcher=()
if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
rm -rf "$work/consumer"
cmake -S "$repo/tests/packaging/consumer" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$prefix" -DCMAKE_IGNORE_PREFIX_PATH=/usr -DCONSUMER_HEADERS_ALONE=OFF \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDA=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON \
  "${launcher[@]}" >"$work/consumer.log"
cmake --build "$work/consumer" >>"$work/consumer.log"
ldd "$work/consumer/consumer" | grep -E "libtsnap|libtorch_cpu"
"$work/consumer/consumer" "$work/consumer"
echo "test-wheel: ok"
