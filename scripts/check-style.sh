#!/usr/bin/env bash
# The house style where a tool can check it (STYLE.md):
#  - clang-format (.clang-format) over every C++ file of the repository: any file it would
#    change fails the check (fix: clang-format-14 -i FILE);
#  - clang-tidy (.clang-tidy) over the library's sources that build without LibTorch's
#    operator headers (common, io, format and the torch-free readers: the objects of the
#    torch-free tool), with the flags of build/compile_commands.json (scripts/build.sh makes
#    it). Both are Debian's clang 14 tools (scripts/install-deps.sh).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
format="$(command -v clang-format-14 || command -v clang-format)"
tidy="$(command -v clang-tidy-14 || command -v clang-tidy)"

mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.hpp' | grep -v '^tests/fuzz/corpus/')
bad=()
for f in "${files[@]}"; do
  if ! "$format" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]} > 0)); then
  echo "check-style: ${#bad[@]} file(s) do not match .clang-format (run $format -i on them):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check-style: ${#files[@]} C++ files match .clang-format"

build="${TSNAP_BUILD_DIR:-$repo/build}"
if [[ ! -f "$build/compile_commands.json" ]]; then
  echo "check-style: $build/compile_commands.json is missing (run scripts/build.sh first)" >&2
  exit 1
fi
mapfile -t sources < <(git ls-files 'src/common/*.cpp' 'src/io/*.cpp' 'src/format/*.cpp' \
  src/restore/{mapped_snapshot,reshard,read_plan,read_chunks,shard_reader,s3_fetch,verify,hf_export}.cpp |
  grep -v 'src/common/state_dict.cpp')
# A few sources per process, one process per core.
if ! printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -n 4 "$tidy" -p "$build" --quiet; then
  echo "check-style: clang-tidy found problems (above)"
  exit 1
fi
echo "check-style: clang-tidy passed on ${#sources[@]} library sources"
