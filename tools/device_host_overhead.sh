#!/usr/bin/env bash
# One device call for issue 40's host questions on the GPU kind at hand, most valuable first, each part time-boxed:
#  1. the host axis suite (configs/suites/flux_host_axis.yaml: the team's W = 2, 8 on this host and on 1.25x, 1.5x
#     slower ones);
#  2. Lightning against its bare twin in the team's eager step, W = 2 and 8, five seeds (flux_harness_user.yaml);
#  3. where each harness's host time goes at W = PYSPY_W (default 2; py-spy, tools/profile_host.sh);
#  4. idle probes at W=8 with the launch queue as is and 4x as deep (CUDA_SCALE_LAUNCH_QUEUES, a driver setting of
#     the process): whether the probe's host still waits on the device;
#  5. eager cells of the decision map (MAP_CELLS).
# A part's time box *_S=0 leaves it out. $OUT/all.tgz holds everything (partial.tgz is refreshed every 20 s in case the call is cut).
#   OUT=/some/dir tools/device_host_overhead.sh
set -u
export WANDB_SILENT=true PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%FT%TZ) $*"; }
part() { local s=$1; shift; [ "$s" = 0 ] || timeout "$s" "$@"; }  # a time-boxed part; 0 leaves it out (timeout 0: none)
(while sleep 20; do tar czf "$OUT/p.tmp" -C "$OUT" --exclude='*.tgz' --exclude=p.tmp --exclude=traces --exclude=wandb \
  --exclude='*.pt' --exclude='*.raw' . 2>/dev/null && mv "$OUT/p.tmp" "$OUT/partial.tgz"; done) &
saver=$!
log device; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; git log --oneline -1
log "host axis"
part ${HOST_AXIS_S:-150} python3 scripts/sweep.py configs/suites/flux_host_axis.yaml --output-root "$OUT/suites" \
  --in-process 2>&1 | grep -v "^sweep ━" | tail -4
log "Lightning and its bare twin, the team's eager step"
part ${TWIN_S:-150} python3 scripts/sweep.py configs/suites/flux_harness_user.yaml --output-root "$OUT/suites" \
  --in-process 2>&1 | grep -v "^sweep ━" | tail -4
W=${PYSPY_W:-2}  # py-spy's world: where this GPU kind's step is host bound (the H200: 2; an H100: 8)
log "py-spy, W=$W, both harnesses"
for h in lightning bare; do
  part ${PYSPY_S:-45} tools/profile_host.sh "$OUT/pyspy_w${W}_$h" --config configs/flux_4608.yaml --simulate-world $W \
    --cp torch --weights ddp --steps 64 --warmup-steps 8 --harness $h --wandb-mode disabled --output "$OUT/pyspy_w${W}_$h.run"
  grep -h "step_ms\|median\|W=$W" "$OUT/pyspy_w${W}_$h.log" | tail -2
done
log "idle probes at W=8 (bare), the launch queue as CUDA sizes it and 4x (CUDA_SCALE_LAUNCH_QUEUES): does the host stall?"
for q in default 4x; do
  ( export CUDA_SCALE_LAUNCH_QUEUES=$q  # default: CUDA's own (train_bench.py's is 4x)
    part ${QUEUE_S:-45} python3 scripts/train_bench.py --config configs/flux_4608.yaml --simulate-world 8 --cp torch \
      --weights ddp --steps 40 --warmup-steps 8 --harness bare --wandb-mode disabled --output "$OUT/queue_$q" \
      > "$OUT/queue_$q.log" 2>&1 )
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); m=d['metrics']; print(sys.argv[2], 'step', \
m['step_ms']['median'], 'busy', m.get('device_busy_ms',{}).get('median'), 'issue', m.get('host_issue_ms',{}).get('median'), \
'hold', d.get('probe_hold_ms'))" "$OUT/queue_$q/summary.json" $q 2>&1 | tail -1
done
log "map cells, eager"
OUT=$OUT/map_eager CELLS="${MAP_CELLS:-4608:1:2 4608:2:2 4608:1:8 4608:32:8 16384:1:1 16384:1:8}" \
  part ${MAP_S:-150} tools/plan_map.sh --builds eager --cp none,allgather-kv,ulysses,tp --weights ddp,zero2 \
  --steps 8 --warmup-steps 3 2>&1 | grep "^== \|^best\|rror"
kill $saver; tar czf "$OUT/all.tgz" -C "$OUT" --exclude='*.tgz' --exclude=traces --exclude=wandb --exclude='*.pt' \
  --exclude='*.raw' . && rm -f "$OUT/partial.tgz"
log done
