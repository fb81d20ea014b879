#!/usr/bin/env bash
# The decision maps of Flux.1 (full fine-tune) and Flux.1 with LoRA, ranked from the runs measured on the H100
# (scripts/plan.py --measured: each plan takes the run with its settings; nothing runs, no GPU needed).
#   bash docs/archive/2026-12-07d-h100-flux1-depth-lora/maps.sh       (from the repository's root)
set -euo pipefail
here=docs/archive/2026-12-07d-h100-flux1-depth-lora
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/runs/checkpointing" "$tmp/runs/depth_lora"
tar xJf docs/archive/2026-12-07-h100-flux1-checkpointing/runs.tar.xz -C "$tmp/runs/checkpointing"
tar xJf $here/runs.tar.xz -C "$tmp/runs/depth_lora"
py=${PYTHON:-.venv/bin/python}
$py scripts/plan.py --config configs/flux1.yaml --memory-gib 80 --measured "$tmp/runs" --output "$tmp/flux1" \
  --cells "4608:1:1 4608:2:2 4608:4:4 4608:16:4 4608:8:8 4608:16:8 4608:32:8 16896:8:8 65536:1:8 98304:1:8" \
  --builds eager,compiled \
  --checkpointing none,selective,full --fp8 none,rowwise,tensorwise > "$tmp/flux1.log" 2>&1 || true
$py scripts/plan.py --config configs/flux1_lora.yaml --memory-gib 80 --measured "$tmp/runs/depth_lora/flux1_lora" \
  --output "$tmp/lora" --cells "4608:1:1 4608:1:2 4608:1:4 4608:1:8 4608:2:2 4608:4:4 4608:8:8 4608:16:8 4608:32:8
  16896:1:1 16896:1:8 16896:8:8" \
  --builds eager,compiled,graph --checkpointing none,selective,full > "$tmp/lora.log" 2>&1 || true
for m in flux1 lora; do
  mkdir -p $here/map_$m && rm -f $here/map_$m/*
  cp "$tmp/$m"/map.md "$tmp/$m"/map.png "$tmp/$m"/map.json $here/map_$m/
  # every plan of each cell, ranked or left out with why (plan.json: ~1000 plans a cell), in one tarball
  (cd "$tmp/$m" && tar cJf - */plan.json) > $here/map_$m/plans.tar.xz
  cat $here/map_$m/map.md
done
