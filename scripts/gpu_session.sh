#!/usr/bin/env bash
# Every GPU test and benchmark of a session, in one call on the lent device (see README, "On a GPU").
# Usage: OUT=/some/dir scripts/gpu_session.sh [steps]   -> $OUT/session.log, $OUT/runs.tar.gz
set -u
OUT=${OUT:-runs/gpu_session}; mkdir -p "$OUT"
STEPS=${1:-20}
export PYTHONUNBUFFERED=1 WANDB_SILENT=true
R=runs/gpu; rm -rf "$R"; mkdir -p "$R"
log() { echo "== $(date -u +%FT%TZ) $*"; }
{
  log "device"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, lightning, diffusers; print('torch', torch.__version__, 'lightning', lightning.__version__, 'diffusers', diffusers.__version__)"
  log "pytest -m gpu"; python3 -m pytest -m gpu -q -p no:cacheprovider tests/ 2>&1 | tail -15
  F=configs/flux_4608.yaml
  for cp in none torch; do
    log "train $cp"; python3 scripts/train_bench.py --config $F --devices 1 --cp $cp --steps "$STEPS" \
      --group gpu-session --output $R/train-$cp 2>&1 | tail -14
    log "train $cp, op timing off"; python3 scripts/train_bench.py --config $F --devices 1 --cp $cp --steps "$STEPS" \
      --timing false --wandb-mode disabled --output $R/train-$cp-notiming 2>&1 | tail -6
  done
  log "train torch alltoall"; python3 scripts/train_bench.py --config $F --devices 1 --cp torch --rotate alltoall \
    --steps "$STEPS" --wandb-mode disabled --output $R/train-torch-alltoall 2>&1 | tail -12
  log "wandb files"; find $R -name "*.wandb" | head
  log "done"
} 2>&1 | tee "$OUT/session.log"
tar czf "$OUT/runs.tar.gz" --exclude='*.wandb' "$R" 2>/dev/null
