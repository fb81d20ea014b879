#!/usr/bin/env bash
# Every GPU test and benchmark of a session, in one call on the lent device, by section.
# Usage: OUT=/some/dir scripts/gpu_session.sh SECTION...   (sections below; default: all)
#   -> $OUT/session.log, $OUT/runs.tar.gz (summaries, traces; no wandb binaries)
set -u
OUT=${OUT:-runs/gpu_session}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_SILENT=true
R=runs/gpu; mkdir -p "$R"
F=configs/flux_4608.yaml
TB="python3 scripts/train_bench.py --config $F --devices 1 --group gpu-session --overwrite"  # sections rerun into runs/gpu/<name>
log() { echo "== $(date -u +%FT%TZ) $*"; }
tb() { local name=$1; shift; log "train $name: $*"; $TB --output "$R/$name" "$@" 2>&1 | grep -vE "Warning|warn\(|^\s*$" | tail -18; }

device() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, lightning, diffusers, wandb; print('torch', torch.__version__, 'lightning', lightning.__version__, 'diffusers', diffusers.__version__, 'wandb', wandb.__version__)"
}

gpu_tests() { log "pytest -m gpu"; python3 -m pytest -m gpu -q -p no:cacheprovider tests/ 2>&1 | tail -15; }

# Issue 3: instrumentation overhead (regions on/off alternating in one process) and fidelity (profiler).
timing() {
  tb w1-none-ab-profile --cp none --steps 40 --warmup-steps 5 --timing-ab true --profile true --profile-steps 3
  tb w1-torch-profile --cp torch --steps 20 --warmup-steps 5 --profile true --profile-steps 3 --wandb-mode disabled
}

# Issue 6: eager vs compiled, per-rank steps simulated at W = 2, 4, 8 (one GPU, no communication).
simulate() {
  tb w1-none --cp none --steps 20 --warmup-steps 3 --wandb-mode disabled
  tb w1-none-compiled --cp none --compile true --steps 20 --warmup-steps 3 --wandb-mode disabled
  for w in 2 8; do for cp in allgather-kv ulysses; do
    tb sim$w-$cp --simulate-world $w --cp $cp --steps 20 --warmup-steps 3 --wandb-mode disabled
    tb sim$w-$cp-compiled --simulate-world $w --cp $cp --compile true --steps 20 --warmup-steps 3 --wandb-mode disabled
  done; done
  tb sim4-ulysses-compiled --simulate-world 4 --cp ulysses --compile true --steps 20 --warmup-steps 3 --wandb-mode disabled
}

# torch.compile of a block under torch's context_parallel (world size 1): does it compose on this torch?
compile_cp() { log "compile under context_parallel"; python3 scripts/check_compile_cp.py 2>&1 | tail -8; }

# cuDNN SDPA with S_q != S_kv (allgather-kv's shapes) on this torch
cudnn_qkv() { log "cuDNN SDPA, S_q != S_kv"; python3 scripts/check_cudnn_qkv.py 2>&1 | tail -8; }

# Issue 4: isolated ops at per-rank shapes, seed method beside, CUDA graphs on/off; plain torch timing beside.
ops() {
  log "pytest -m gpu tests/test_ops.py"; python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_ops.py 2>&1 | tail -8
  python3 scripts/plain_sdpa_timing.py --seq-len 4608 2>&1 | tail -4
  python3 scripts/plain_sdpa_timing.py --seq-len 100000 --reps 5 2>&1 | tail -4
  OPS="python3 scripts/train_bench.py --ops-only --config $F --seq-lens 4608,100000 --seed-compat --graph --group gpu-ops --overwrite"
  log "ops none"; $OPS --cp none --output $R/ops-none 2>&1 | tail -40
  log "ops torch W=1"; $OPS --devices 1 --cp torch --output $R/ops-torch-w1 2>&1 | tail -30
  log "ops sim torch"; $OPS --cp torch --simulate-world 2,4,8 --output $R/ops-sim-torch 2>&1 | tail -60
  log "ops sim allgather-kv"; $OPS --cp allgather-kv --sdpa-backend flash --simulate-world 2,4,8 --output $R/ops-sim-agkv 2>&1 | tail -40
}

# Issue 9: FSDP2 vs DDP weights at world size 1.
fsdp() {
  for w in ddp fsdp; do tb w1-none-$w --cp none --weights $w --steps 15 --warmup-steps 3 --wandb-mode disabled; done
  tb w1-torch-fsdp --cp torch --weights fsdp --steps 15 --warmup-steps 3 --wandb-mode disabled
}

# Issue 6, second pass: allgather-kv (flash: see cudnn_qkv), CUDA graphs (reduce-overhead) against host-bound steps.
simulate2() {
  tb w1-none-flash --cp none --sdpa-backend flash --steps 15 --warmup-steps 3 --wandb-mode disabled
  tb sim2-allgather-kv --simulate-world 2 --cp allgather-kv --steps 15 --warmup-steps 3 --wandb-mode disabled
  tb sim2-allgather-kv-compiled --simulate-world 2 --cp allgather-kv --compile true --steps 15 --warmup-steps 3 --wandb-mode disabled
  tb w1-none-ro --cp none --compile true --compile-mode reduce-overhead --steps 15 --warmup-steps 4 --wandb-mode disabled
  for w in 2 8; do
    tb sim$w-ulysses-ro --simulate-world $w --cp ulysses --compile true --compile-mode reduce-overhead \
      --steps 15 --warmup-steps 4 --wandb-mode disabled
  done
  tb sim4-ulysses-compiled --simulate-world 4 --cp ulysses --compile true --steps 15 --warmup-steps 3 --wandb-mode disabled
}

# Issue 4 gap: the seed method under real torch CP at W=1 (host-bound hypothesis).
ops_torch_w1() {
  python3 scripts/train_bench.py --ops-only --config $F --seq-lens 4608 --seed-compat --graph --group gpu-ops --overwrite \
    --devices 1 --cp torch --output $R/ops-torch-w1 2>&1 | tail -30
}

# Issue 6, third pass: where the per-rank step goes at W = 1, 2, 8 (kernel breakdown of compiled steps),
# and the CUDA-graph runs of Ulysses again with cuDNN (call 2's pinned flash by mistake).
profile_sims() {
  tb w1-none-compiled-profile --cp none --compile true --steps 12 --warmup-steps 3 --profile true --wandb-mode disabled
  for w in 2 8; do
    tb sim$w-ulysses-compiled-profile --simulate-world $w --cp ulysses --compile true --steps 12 --warmup-steps 3 \
      --profile true --wandb-mode disabled
    tb sim$w-ulysses-ro --simulate-world $w --cp ulysses --compile true --compile-mode reduce-overhead \
      --steps 15 --warmup-steps 4 --wandb-mode disabled
  done
}

# Issue 6, fourth pass: steady-state (pipelined) step timing, AdamW state sharded like ZeRO-1 (--weights zero).
Z="--steps 20 --wandb-mode disabled"
RO="--compile true --compile-mode reduce-overhead --warmup-steps 4"
zero_w1() {
  tb w1-none-ro --cp none $RO $Z
  tb w1-none-compiled --cp none --compile true --warmup-steps 3 $Z
}
zero_w2() {
  tb sim2-ulysses-zero-ro --simulate-world 2 --cp ulysses --weights zero $RO $Z
  tb sim2-ulysses-zero-compiled --simulate-world 2 --cp ulysses --weights zero --compile true --warmup-steps 3 $Z
  tb sim2-ulysses-zero --simulate-world 2 --cp ulysses --weights zero --warmup-steps 3 $Z
}
zero_w8() {
  tb sim8-ulysses-zero-ro --simulate-world 8 --cp ulysses --weights zero $RO $Z
  tb sim8-ulysses-zero-compiled --simulate-world 8 --cp ulysses --weights zero --compile true --warmup-steps 3 $Z
}
zero_w4() { tb sim4-ulysses-zero-ro --simulate-world 4 --cp ulysses --weights zero $RO $Z; }
# Issue 6, fifth pass: batches in pinned memory (a pageable copy drained the device at every step start).
pinned_min() {  # the three runs the issue-6 ratios need, when device time is short
  tb w1-none-ro-pinned --cp none $RO $Z
  tb sim2-ulysses-zero-ro-pinned --simulate-world 2 --cp ulysses --weights zero $RO $Z
  tb sim8-ulysses-zero-ro-pinned --simulate-world 8 --cp ulysses --weights zero $RO $Z
}
pinned() {
  pinned_min
  tb w1-none-pinned --cp none --warmup-steps 3 $Z
  tb sim2-ulysses-zero-compiled-profile --simulate-world 2 --cp ulysses --weights zero --compile true \
    --warmup-steps 3 --steps 12 --profile true --wandb-mode disabled
  tb sim4-ulysses-zero-ro-pinned --simulate-world 4 --cp ulysses --weights zero $RO $Z
}
# Issue 6, sixth pass: where the loop still waits (--sync-debug), the loader in a worker (loop_ms), and the
# Ulysses simulation with the real layout copies instead of a head slice.
sync_test() { python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py -k sync 2>&1 | tail -30; }
# W = 1 (--cp none) and simulated W = 2, 8 (Ulysses, ZeRO), whole model in one CUDA graph: ro_model NAME [W > 1 flags]
ro_model() {
  local name=$1; shift
  tb w1-$name --cp none --compile-scope model $RO $Z
  for w in 2 8; do tb w$w-$name --simulate-world $w --cp ulysses --weights zero "$@" --compile-scope model $RO $Z; done
}
syncs() {
  sync_test
  tb w1-none-ro-syncs --cp none $RO --steps 12 --sync-debug true --wandb-mode disabled
  tb sim8-ulysses-zero-ro-syncs --simulate-world 8 --cp ulysses --weights zero $RO --steps 12 --sync-debug true \
    --wandb-mode disabled
}
layout() {
  pinned_min
  tb w1-none-compiled-profile --cp none --compile true --steps 12 --warmup-steps 3 --profile true --wandb-mode disabled
  tb sim2-ulysses-zero-compiled-profile --simulate-world 2 --cp ulysses --weights zero --compile true \
    --warmup-steps 3 --steps 12 --profile true --wandb-mode disabled
}
# Issue 6, seventh pass: batches handed out in the run's dtype (no host casts between steps); the whole model
# in one graph (--compile-scope model) against per-block graphs; a profiled reduce-overhead step at W=8.
scope() {
  sync_test
  pinned_min
  ro_model ro-model
  tb sim8-ulysses-zero-ro-profile --simulate-world 8 --cp ulysses --weights zero $RO --steps 10 --profile true \
    --wandb-mode disabled
}
# Issue 6, eighth pass: batches from 4 loader workers (one could not keep up with W=8's step), whole-model graphs.
workers() { sync_test; ro_model ro-model-workers; }
# Issue 6, ninth pass (it replaced the unrun between_w1/w8 and split_cond: every run records data_ms,
# transfer_ms): split conditioning against the same session's unsplit runs, interleaved per W
# (identical runs differ by ~1 %: the A/B needs both sides in one session); data_ms / transfer_ms on GPU.
split_ab() {
  tb w1-ab --cp none --compile-scope model $RO $Z
  for w in 2 8; do for s in false true; do
    tb w$w-ab-split$s --simulate-world $w --cp ulysses --weights zero --split-conditioning $s --compile-scope model $RO $Z
  done; done
}
# Issue 6, tenth pass: the loss handed to the host asynchronously (its late .item() drained the device every
# step); the loop's host period split whole (after_ms, prologue_ms, gc_ms), without idle probes (a probe's spin
# kernel delays the steps after it once the host runs ahead); W=8 with Python's GC on a schedule (--gc-every).
NP="--idle-probe-every 0 --compile-scope model"
final_w1() { tb w1-final-np --cp none $NP $RO $Z; }
final_w2() { tb w2-final-np --simulate-world 2 --cp ulysses --weights zero $NP $RO $Z; }
final_w8() { tb w8-final-np --simulate-world 8 --cp ulysses --weights zero $NP $RO $Z; }
final_gc() { tb w8-final-gc --simulate-world 8 --cp ulysses --weights zero --gc-every 50 $NP $RO $Z; }
final() { sync_test; final_w1; final_w2; final_w8; final_gc; }  # as separate sections, each is saved when done
timing_ab() {
  tb w1-none-ab-profile --cp none --steps 40 --warmup-steps 5 --timing-ab true --profile true --profile-steps 3
}

sections=${*:-"device timing compile_cp cudnn_qkv ops fsdp simulate simulate2 gpu_tests"}  # all: ~25 min; pick sections per call
for s in $sections; do
  { log "section $s"; $s; } 2>&1 | tee -a "$OUT/session.log"
  # after every section: a call cut short at its time limit still brings back what was measured
  tar czf "$OUT/runs.tar.gz" --exclude='*.wandb' --exclude='debug*.log' "$R" 2>/dev/null
done
log "done" | tee -a "$OUT/session.log"
