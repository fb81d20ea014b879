#!/usr/bin/env bash
# FSDP2's tuning seen in the ledger: rank 0 of 2 (plain data parallelism, the tiny model in bf16, 4 blocks + root),
# the collectives of a typical step for each setting.  Run: bash docs/archive/2026-12-07b-cpu-lora-fp8-fsdp/fsdp_tuning_ledger.sh
set -e
for extra in "" "--fsdp-reshard-last 2" "--fsdp-reshard-last 4" "--fsdp-prefetch 2" "--fsdp-reduce-dtype fp32" "--lora-rank 4"; do
  out=$(mktemp -d)
  python scripts/train_bench.py --simulate-world 2 --cp-degree 1 --data.global_batch 2 --weights fsdp --precision bf16-true \
    --steps 2 --warmup-steps 1 --regions-every 1 --wandb-mode disabled --output "$out" $extra > /dev/null 2>&1
  python -c "import json,sys; d=json.load(open('$out/summary.json'))['comm']['per_step']; print(f\"{sys.argv[1] or '(FSDP2 defaults)':26}\", {k: (v['count'], round(v['bytes']/2**20, 3)) for k, v in d.items()})" "$extra"
done
