#!/usr/bin/env bash
# Contention, the decision map's cells, Flux.1's depth and the host axis (first written 2026-12-05 for what was built
# and not yet run on a GPU, as pending_gpu_call.sh), in one device call, most valuable first,
# each part time-boxed: the GPU tests of the code that changed (the step's micro-batches, the bare loop's idle probe,
# --contention), the contention micro-benchmark, the decision map's 4608-token cells, Flux.1's own depth, the host
# axis, the 16384-token cells. $OUT/all.tgz holds everything (partial.tgz is kept fresh in case the call is cut).
#   OUT=/some/dir tools/device_contention_map_depth.sh
set -u
export WANDB_SILENT=true PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%FT%TZ) $*"; }
(while sleep 20; do tar czf "$OUT/p.tmp" -C "$OUT" --exclude='*.tgz' --exclude=p.tmp --exclude=wandb --exclude='*.pt' . \
  2>/dev/null && mv "$OUT/p.tmp" "$OUT/partial.tgz"; done) &
saver=$!
log device; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; git log --oneline -1
log "gpu tests (the code that changed: step, bare loop's idle probe, contention)"
timeout 100 python3 -m pytest -m gpu -n 4 -q -rfE --tb=short -p no:cacheprovider tests/test_gpu.py -k \
  "contention or bare_and_lightning or training_loop_makes_no or step_graph_trains or simulated_ring_ledger" \
  > "$OUT/gpu_tests.log" 2>&1; tail -4 "$OUT/gpu_tests.log"
log contention bench
timeout 40 python3 tools/contention_bench.py --trials 5 --output "$OUT/contention.json" 2>&1 | tail -8
A="--builds eager --cp none,allgather-kv,ulysses,tp --weights ddp,zero2"
log "map cells, 4608 tokens"
OUT=$OUT CELLS="4608:1:1 4608:1:2 4608:2:2 4608:1:8 4608:32:8 4608:1:4 4608:4:4" timeout 140 tools/plan_map.sh $A \
  --steps 8 --warmup-steps 3 2>&1 | grep "^== \|^best\|rror"
log "Flux.1 depth: 19 + 38 blocks, S 4608, B 8, W 8"
timeout 120 python3 scripts/plan.py --config configs/flux1.yaml --global-batch 8 --world 8 --cp none,ulysses,tp \
  --weights zero2,fsdp,ddp --only dp8-zero2-eager,dp1xulysses8-zero2-eager,dp1xtp8-ddp-eager,dp8-fsdp-eager \
  --steps 4 --warmup-steps 2 --output "$OUT/flux1" 2>&1 | grep -v "^sweep ━\|^\[ok\]" | tail -14
log "host axis"
timeout ${HOST_AXIS_S:-110} python3 scripts/sweep.py configs/suites/flux_host_axis.yaml --output-root "$OUT/suites" --in-process 2>&1 \
  | grep -v "^sweep ━" | tail -6
log "map cells, 16384 tokens"
OUT=$OUT CELLS="16384:1:1 16384:1:8 16384:8:8" timeout ${MAP16K_S:-60} tools/plan_map.sh $A --steps 5 --warmup-steps 2 2>&1 | grep "^== \|^best\|rror"
kill $saver; tar czf "$OUT/all.tgz" -C "$OUT" --exclude='*.tgz' --exclude=wandb --exclude='*.pt' . && rm -f "$OUT/partial.tgz"
log done
