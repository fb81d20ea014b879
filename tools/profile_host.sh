#!/usr/bin/env bash
# Where a run's host time goes: py-spy samples train_bench.py's threads, and the raw profile (tens of MB) is
# aggregated where it was recorded (tools/pyspy_top.py), over the whole run and over the training step.
#   tools/profile_host.sh OUT_PREFIX train_bench.py-args...   -> OUT_PREFIX.{log,top.txt,step.txt}
set -eu
out=$1; shift
py-spy record --nonblocking --threads --format raw -r 200 -o "$out.raw" -- \
  python3 scripts/train_bench.py "$@" > "$out.log" 2>&1 || echo "run failed: see $out.log"
python3 tools/pyspy_top.py "$out.raw" --within train_bench.py --top 45 > "$out.top.txt" || true
python3 tools/pyspy_top.py "$out.raw" --within flux_cp/train/step.py --top 45 > "$out.step.txt" || true
rm -f "$out.raw"
