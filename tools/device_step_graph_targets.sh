#!/usr/bin/env bash
# One device call for issue 39's targets and issue 40's host axis, most valuable first, each part time-boxed:
#  1. the GPU tests of the code that changed (named one per line: a cut call still says which passed);
#  2. where the best W=1 step's MFU goes: its kernels by part (GEMM, attention, the rest), one --profile run;
#  3. the target cells at 4608 tokens under the step graph (best W=1 step; B = W = 8 plain DP, ZeRO-2 gathering in
#     the backward and in the next forward; B = 1, W = 8 TP);
#  4. B = 1 at 65536 tokens, W = 1 and 8 (eager: device bound at that length);
#  5. the host axis suite (configs/suites/flux_host_axis.yaml). A part's time box *_S=0 leaves it out; TESTS_K,
#     GRAPH_CELLS, GRAPH_BUILDS and GRAPH_ONLY change what parts 1 and 3 run; PROFILE_B the samples a profiled step.
# $OUT/all.tgz holds everything (partial.tgz is refreshed every 20 s in case the call is cut).
#   OUT=/some/dir tools/device_step_graph_targets.sh
set -u
export WANDB_SILENT=true PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%FT%TZ) $*"; }
part() { local s=$1; shift; [ "$s" = 0 ] || timeout "$s" "$@"; }  # a time-boxed part; 0 leaves it out (timeout 0: none)
(while sleep 20; do tar czf "$OUT/p.tmp" -C "$OUT" --exclude='*.tgz' --exclude=p.tmp --exclude=traces --exclude=wandb --exclude='*.pt' . \
  2>/dev/null && mv "$OUT/p.tmp" "$OUT/partial.tgz"; done) &
saver=$!
log device; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; git log --oneline -1
log "gpu tests"
part ${TESTS_S:-130} python3 -m pytest -m gpu -n 4 -v -rfE --tb=short -p no:cacheprovider tests/test_gpu.py -k \
  "${TESTS_K:-simulated_tp_rank or simulated_ulysses_zero_rank or bare_and_lightning or training_loop_makes_no}" \
  > "$OUT/gpu_tests.log" 2>&1; grep -c PASSED "$OUT/gpu_tests.log"; grep "FAILED\|ERROR\| passed\| failed" "$OUT/gpu_tests.log" | tail -8
log "the best W=1 step's kernels by part (compiled per block, step graph; without the graph if the profiler fails it)"
# PROFILE_B=4: four samples a step (the optimizer amortised: the W=1 step's best MFU)
profile() { part ${PROFILE_S:-80} python3 scripts/train_bench.py --config configs/flux_4608.yaml --compile true \
  --steps 12 --profile true --profile-steps 3 --data.global_batch ${PROFILE_B:-1} --wandb-mode disabled \
  --output "$OUT/profile_w1_$1" "${@:2}" > "$OUT/profile_w1_$1.log" 2>&1; }
profile graph --step-graph true --warmup-steps 12 || profile compiled --warmup-steps 5
find "$OUT" -path '*profile_w1_*/traces' -prune -exec rm -rf {} +  # tens of MB a trace: the breakdown is in summary.json
log "target cells, 4608 tokens, step graph"
OUT=$OUT/graph CELLS=${GRAPH_CELLS:-"4608:1:1 4608:8:8"} part ${GRAPH_S:-200} tools/plan_map.sh \
  --builds ${GRAPH_BUILDS:-graph} --only ${GRAPH_ONLY:-dp1-ddp-graph,dp8-zero2-graph,dp8-zero2f-graph} --steps 8 \
  --warmup-steps 12 2>&1 | grep "^== \|^best\|rror"
OUT=$OUT/graph_tp CELLS="4608:1:8" part ${GRAPH_TP_S:-90} tools/plan_map.sh --builds graph \
  --only dp1xtp8-ddp-graph --steps 8 --warmup-steps 12 2>&1 | grep "^== \|^best\|rror"
log "65536 tokens, B 1"
OUT=$OUT/long CELLS="65536:1:1 65536:1:8" part ${LONG_S:-80} tools/plan_map.sh --builds eager \
  --only dp1-ddp-eager,dp1xulysses8-zero2-eager,dp1xulysses8-ddp-eager --steps 4 --warmup-steps 2 2>&1 | grep "^== \|^best\|rror"
log "host axis"
part ${HOST_AXIS_S:-150} python3 scripts/sweep.py configs/suites/flux_host_axis.yaml --output-root "$OUT/suites" --in-process \
  2>&1 | grep -v "^sweep ━" | tail -6
kill $saver; tar czf "$OUT/all.tgz" -C "$OUT" --exclude='*.tgz' --exclude=traces --exclude=wandb --exclude='*.pt' . && rm -f "$OUT/partial.tgz"
log done
