#!/usr/bin/env bash
# Runs one libFuzzer target for a while from its seeds (ctest `fuzz.<target>`, scripts/fuzz.sh):
#   run_target.sh <fuzz binary> <seed dir> <work dir> [<kept crashes dir>]
# First replays every input kept in <kept crashes dir> (tests/fuzz/crashes/<target>/) once, as a
# regression check: fails, before fuzzing, when one of them crashes again.
# Seconds: $TSNAP_FUZZ_SECONDS, else $TSNAP_FUZZ_DEFAULT_SECONDS (the build's), else 60.
# New inputs go to <work dir>/corpus (kept between runs), a crashing input to
# <work dir>/artifacts/. Prints "fuzz: <target>: N execs in S s, C crashes" and fails on a crash.
set -uo pipefail
bin="$1" seeds="$2" work="$3" kept="${4:-}"
target="$(basename "$bin")"
target="${target#fuzz_}"
seconds="${TSNAP_FUZZ_SECONDS:-${TSNAP_FUZZ_DEFAULT_SECONDS:-60}}"
mkdir -p "$work/corpus" "$work/artifacts"
rm -f "$work/artifacts"/*

# ASan's defaults hold here (leak checks included: LibTorch's process-wide caches stay reachable).
# UB is fatal (-fno-sanitize-recover); its stack makes the report useful.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

kept_inputs=()
if [[ -n "$kept" && -d "$kept" ]]; then
  for f in "$kept"/*; do [[ -f "$f" ]] && kept_inputs+=("$f"); done
fi
if ((${#kept_inputs[@]} > 0)); then
  # libFuzzer runs file arguments once each (no fuzzing) and stops at the first crash.
  if ! "$bin" -rss_limit_mb=4096 -timeout=30 "${kept_inputs[@]}" >"$work/replay.log" 2>&1; then
    tail -n 60 "$work/replay.log"
    echo "fuzz: $target: an input kept in $kept crashes again (log: $work/replay.log)" >&2
    exit 1
  fi
  echo "fuzz: $target: ${#kept_inputs[@]} kept crash inputs replayed, none crashed"
fi

dict="$(dirname "${BASH_SOURCE[0]}")/tsnap.dict"
start=$SECONDS
"$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=30 -rss_limit_mb=4096 \
  -dict="$dict" -artifact_prefix="$work/artifacts/" "$work/corpus" "$seeds" >"$work/log" 2>&1
rc=$?
elapsed=$((SECONDS - start))
execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)"
crashes=0
for f in "$work/artifacts"/*; do
  [[ -e "$f" ]] || continue
  crashes=$((crashes + 1))
  echo "fuzz: $target: crashing input $f"
done
if ((rc != 0 || crashes > 0)); then
  tail -n 60 "$work/log"
fi
echo "fuzz: $target: ${execs:-?} execs in $elapsed s, $crashes crashes (log: $work/log)"
if ((rc != 0 && crashes == 0)); then
  echo "fuzz: $target: exited with status $rc" >&2
fi
((rc == 0 && crashes == 0))
