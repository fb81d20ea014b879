#!/usr/bin/env bash
# One configuration's step under the Lightning harness with its parts switched off one at a time, next to its bare
# twin, run after run on one device:  scripts/harness_variants.sh OUT train_bench.py-args...
#   -> OUT/variants.txt (one line per run: step median, min, max, host, loop) and OUT/<variant>/summary.json
set -u
out=$1; shift
mkdir -p "$out"
i=0
for v in "--harness bare" "" "--timing false" "--idle-probe-every 0" "--timing false --idle-probe-every 0" \
         "--harness bare"; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  python3 scripts/train_bench.py "$@" $v --output "$out/v$i" > "$out/v$i.log" 2>&1
  python3 - "$out/v$i/summary.json" "${v:-lightning (defaults)}" >> "$out/variants.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); m = d["metrics"]
f = lambda k: f"{m[k]['median']:.1f}" if k in m else "-"
print(f"{sys.argv[2]:<40} step {f('step_ms')} ({m['step_ms']['min']:.1f}-{m['step_ms']['max']:.1f}) host {f('host_ms')} "
      f"loop {f('loop_ms')} busy {f('device_busy_ms')} steady {d['steadiness']['steady']} {d['steadiness']['problems']}")
PY
done
cat "$out/variants.txt"
