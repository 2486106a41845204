#!/usr/bin/env bash
# Draws the plots of docs/benchmarks.md from `tsnap bench` runs (gnuplot, SVG):
#   docs/bench-size.svg      stall and durable time against snapshot size (8 equal fp32
#                            tensors of 0.1-3.7 GiB in all, i.e. up to 4 GB), with the 2-thread
#                            memcpy floor and the raw write + fsync of the same bytes;
#   docs/bench-interval.svg  training-step overhead against the snapshot interval
#                            (`tsnap bench --timeline`, eager and lazy, GPT-2 small + Adam).
# The data (CSV) is kept next to the plots' scripts in $OUT (default: a temporary directory).
# Usage: scripts/bench-plots.sh [DIR]   DIR: where the snapshots go (default /tmp/bench)
# Environment: TSNAP (the tool, default build/tsnap), SIZES, EVERY, STEPS, STEP_MS, SCALE, REPS.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-/tmp/bench}"
tsnap="${TSNAP:-$repo/build/tsnap}"
out="${OUT:-$(mktemp -d)}"
sizes="${SIZES:-0.1 0.25 0.5 1 2 3.7}"
every="${EVERY:-2 5 10 20}"
steps="${STEPS:-20}"
step_ms="${STEP_MS:-300}"
scale="${SCALE:-1}"
reps="${REPS:-2}"
mkdir -p "$dir" "$out"

# 1. Stall and durable time against size: one CSV row per size.
size_csv="$out/size.csv"
echo "gib,bytes,stall_s,durable_s,memcpy_s,raw_write_s" >"$size_csv"
for s in $sizes; do
  "$tsnap" bench --tensors 8 --size "$s" --reps "$reps" --no-torch --no-restore --csv \
    --dir "$dir" >"$out/size-$s.csv"
  awk -F, -v s="$s" '
    $3 == "tsnap_stall" { stall = $4; bytes = $7 } $3 == "tsnap_save" { durable = $4 }
    $3 == "memcpy" { mem = $4 } $3 == "raw_write" { raw = $4 }
    END { printf "%s,%s,%s,%s,%s,%s\n", s, bytes, stall, durable, mem, raw }' \
    "$out/size-$s.csv" >>"$size_csv"
done

# 2. Step-time overhead against the interval, eager and lazy.
interval_csv="$out/interval.csv"
echo "every,eager_pct,lazy_pct,eager_bound_pct" >"$interval_csv"
for e in $every; do
  row="$e"
  for mode in eager lazy; do
    flag=()
    if [[ "$mode" == lazy ]]; then flag=(--lazy); fi
    "$tsnap" bench --timeline --preset gpt2-small --size "$scale" --steps "$steps" --every "$e" \
      --step-ms "$step_ms" "${flag[@]}" --json --dir "$dir" >"$out/timeline-$mode-$e.json"
    pct=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["overhead_pct"])' \
      "$out/timeline-$mode-$e.json")
    row="$row,$pct"
    if [[ "$mode" == eager ]]; then
      # The issue's bound for eager staging: stall / (interval x step time) + 1 %.
      bound=$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1])); s = j["summary"]
stall = sorted(x["stall_s"] for x in j["saves"])[len(j["saves"]) // 2]
print(100 * stall / (int(sys.argv[2]) * s["mean_step_without_s"]) + 1)' \
        "$out/timeline-$mode-$e.json" "$e")
    fi
  done
  echo "$row,$bound" >>"$interval_csv"
done

cat >"$out/size.gp" <<GP
set terminal svg size 860,420 dynamic font 'sans,11'
set output '$repo/docs/bench-size.svg'
set datafile separator ','
set title 'tsnap save against snapshot size (8 fp32 tensors, io_uring + O_DIRECT)'
set xlabel 'snapshot size (GB)'
set ylabel 'seconds'
set logscale xy
set key left top
set grid
plot '$size_csv' using (\$2/1e9):4 skip 1 with linespoints lw 2 pt 7 title 'durable save', \
     '' using (\$2/1e9):6 skip 1 with linespoints dt 2 pt 6 title 'raw write + fsync', \
     '' using (\$2/1e9):3 skip 1 with linespoints lw 2 pt 5 title 'stall (eager)', \
     '' using (\$2/1e9):5 skip 1 with linespoints dt 2 pt 4 title 'memcpy 2 threads (stall floor)'
GP
gnuplot "$out/size.gp"

cat >"$out/interval.gp" <<GP
set terminal svg size 860,420 dynamic font 'sans,11'
set output '$repo/docs/bench-interval.svg'
set datafile separator ','
set title 'training step-time overhead against the snapshot interval (GPT-2 small + Adam, ${step_ms} ms steps)'
set xlabel 'snapshot every N steps'
set ylabel 'overhead (%)'
set logscale x
set xtics (2, 5, 10, 20, 50)
set key right top
set grid
plot '$interval_csv' using 1:2 skip 1 with linespoints lw 2 pt 7 title 'eager', \
     '' using 1:4 skip 1 with linespoints dt 2 pt 6 title 'eager target: stall / (N x step) + 1 %', \
     '' using 1:3 skip 1 with linespoints lw 2 pt 5 title 'lazy', \
     1 with lines dt 3 title 'lazy target: 1 %'
GP
gnuplot "$out/interval.gp"
echo "plots: docs/bench-size.svg docs/bench-interval.svg; data: $out"
