#!/usr/bin/env bash
# The decision map of Flux.1 with LoRA, ranked from every LoRA run measured on the H100 at its depth: 2026-12-07d's
# (the regime table, DDP under one graph, Ulysses x 8) and this page's (the frozen base in FP8). scripts/plan.py
# --measured: each plan takes the run with its settings; nothing runs, no GPU needed.
#   bash docs/results/2026-12-07f-h100-lora-fp8-cudnn/map_lora.sh       (from the repository's root)
set -euo pipefail
here=docs/results/2026-12-07f-h100-lora-fp8-cudnn
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/d" "$tmp/runs"
tar xJf docs/archive/2026-12-07d-h100-flux1-depth-lora/runs.tar.xz -C "$tmp/d"
tar xJf $here/runs_call1.tar.xz -C "$tmp/runs" flux1_lora_fp8
mv "$tmp/d/flux1_lora" "$tmp/runs/"
py=${PYTHON:-.venv/bin/python}
$py scripts/plan.py --config configs/flux1_lora.yaml --memory-gib 80 --measured "$tmp/runs" --output "$tmp/lora" \
  --cells "4608:1:1 4608:1:2 4608:2:2 4608:1:4 4608:4:4 4608:1:8 4608:8:8 4608:16:8 4608:32:8 16896:1:1 16896:1:8
  16896:8:8" --builds eager,compiled,graph --checkpointing none,selective,full --fp8 none,tensorwise,rowwise \
  > "$tmp/lora.log" 2>&1 || true  # non-zero where a cell has no plan measured: the map still lists it
[ -f "$tmp/lora/map.md" ] || { tail -20 "$tmp/lora.log"; exit 1; }
mkdir -p $here/map_lora && rm -f $here/map_lora/*
cp "$tmp/lora"/map.md "$tmp/lora"/map.png "$tmp/lora"/map.json $here/map_lora/
# every plan of each cell, ranked or left out with why (plan.json), in one tarball
(cd "$tmp/lora" && tar cJf - */plan.json) > $here/map_lora/plans.tar.xz
cat $here/map_lora/map.md
