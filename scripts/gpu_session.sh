#!/usr/bin/env bash
# A device call: the GPU tests, then named benchmark suites (configs/suites/<suite>.yaml, run by scripts/sweep.py),
# each into its own results folder. Nothing here is a benchmark of its own: suites are.
#   OUT=/some/dir scripts/gpu_session.sh [tests] SUITE...    e.g.  tests flux_w1 flux_sim_eager
#   -> $OUT/session.log, $OUT/<suite>/ (sweep.json, one folder per run: summary.json, train_bench.log)
set -u
OUT=${OUT:-runs/gpu_session}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_SILENT=true
log() { echo "== $(date -u +%FT%TZ) $*"; }
# The device returns flat files only, and a call cut at its limit returns what $OUT holds: keep a tarball fresh.
(while sleep 30; do tar czf "$OUT/partial.tar.gz.tmp" -C "$OUT" --exclude=wandb --exclude='*.tar.gz*' . 2>/dev/null \
  && mv "$OUT/partial.tar.gz.tmp" "$OUT/partial.tar.gz"; done) &
{
  log device
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, lightning, diffusers; print('torch', torch.__version__, 'lightning', lightning.__version__, 'diffusers', diffusers.__version__)"
  for s in "$@"; do
    if [ "$s" = tests ]; then
      log "pytest -m gpu"; python3 -m pytest -m gpu -q -p no:cacheprovider tests/ 2>&1 | tail -15
    else
      log "suite $s"; python3 scripts/sweep.py "configs/suites/$s.yaml" --output "$OUT/$s" --in-process 2>&1 | tail -40
      tar czf "$OUT/$s.tar.gz" -C "$OUT" --exclude=wandb "$s"  # one file per suite: the device returns flat files
    fi
  done
  log done
} 2>&1 | tee -a "$OUT/session.log"
