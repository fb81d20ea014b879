#!/usr/bin/env bash
# One device call for the cells that do not fit an H100's 80 GiB (run with needs_h200), each part time-boxed:
#  1. ~100k tokens (98304: the seed's long case), B = 1: the one-GPU step (~77.6 GiB estimated) and Ulysses x 8 + ZeRO-2;
#  2. Flux.1's own depth (19 + 38 blocks) at B = W = 8: the ZeRO-2 plans (~79 GiB a rank estimated), with FSDP and TP
#     beside them on the same GPU for the depth prediction;
#  3. where TP's peak memory sits (tools/memory_peak.py), against the planner's estimate.
# A part's time box *_S=0 leaves it out. $OUT/memory.tgz holds everything (partial refreshed every 20 s).
#   OUT=/some/dir tools/device_memory_over_80gib.sh
set -u
export WANDB_SILENT=true PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%FT%TZ) $*"; }
part() { local s=$1; shift; [ "$s" = 0 ] || timeout "$s" "$@"; }  # a time-boxed part; 0 leaves it out (timeout 0: none)
(while sleep 20; do tar czf "$OUT/m.tmp" -C "$OUT" --exclude='*.tgz' --exclude=m.tmp --exclude=traces --exclude=wandb \
  --exclude='*.pt' long100k flux1 2>/dev/null; mv "$OUT/m.tmp" "$OUT/memory.partial.tgz"; done) &
saver=$!
log device; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; git log --oneline -1
log "~100k tokens, B 1, W 1 and 8"
OUT=$OUT/long100k CELLS="98304:1:1 98304:1:8" part ${LONG100K_S:-200} tools/plan_map.sh --builds eager \
  --only dp1-ddp-eager,dp1xulysses8-zero2-eager --steps 3 --warmup-steps 1 2>&1 | grep "^== \|^best\|rror\|GiB"
log "Flux.1 depth: 19 + 38 blocks, S 4608, B 8, W 8"
part ${FLUX1_S:-150} python3 scripts/plan.py --config configs/flux1.yaml --global-batch 8 --world 8 --cp none,ulysses,tp \
  --weights zero2,fsdp,ddp --only ${FLUX1_ONLY:-dp8-zero2-eager,dp1xulysses8-zero2-eager,dp1xtp8-ddp-eager,dp8-fsdp-eager} \
  --steps 4 --warmup-steps 2 --output "$OUT/flux1" 2>&1 | grep -v "^sweep ━\|^\[ok\]" | tail -14
log "where TP's peak sits: 2 + 4 blocks, B 8, TP x 8 (the planner's estimate 6.0 GiB, measured 8.1 on the H200)"
part ${TPMEM_S:-60} python3 tools/memory_peak.py --config configs/flux_4608.yaml --accelerator gpu --harness bare --cp tp \
  --simulate-world 8 --data.global_batch 8 --warmup-steps 2 --steps 2 --wandb-mode disabled --output "$OUT/flux1/tp_mem" \
  > "$OUT/flux1/tp_mem.log" 2>&1; tail -30 "$OUT/flux1/tp_mem.log"
kill $saver; tar czf "$OUT/memory.tgz" -C "$OUT" --exclude='*.tgz' --exclude=traces --exclude=wandb --exclude='*.pt' \
  long100k flux1 && rm -f "$OUT/memory.partial.tgz"
log done
