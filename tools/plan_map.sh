#!/usr/bin/env bash
# The decision map on a lent GPU: scripts/plan.py --cells, every cell S:B:W (sequence length, global batch, GPUs) in one
# process (imports and the CUDA context once, ~15-25 s a process saved per cell), each cell's plan.json and run
# summaries into $OUT/map/<cell>/, then the map (map.md, map.png, map.json) and one tarball ($OUT/map.tar.gz; a call
# cut at its limit still returns $OUT/map.partial.tar.gz, refreshed every 20 s).
#   OUT=/some/dir CELLS="4608:1:8 4608:8:8" tools/plan_map.sh [plan.py args...]   e.g. --builds eager
set -u
OUT=${OUT:-runs/plan_map}; mkdir -p "$OUT/map"
export PYTHONUNBUFFERED=1 WANDB_SILENT=true
CONFIG=${CONFIG:-configs/flux_4608.yaml}
pack() { tar czf "$OUT/$1.tmp" -C "$OUT" --exclude=wandb --exclude='*.pt' map 2>/dev/null && mv "$OUT/$1.tmp" "$OUT/$1"; }
(while sleep 20; do pack map.partial.tar.gz; done) &
saver=$!
trap 'kill $saver 2>/dev/null' EXIT
echo "== $(date -u +%FT%TZ) cells ${CELLS:?give CELLS=\"S:B:W ...\"}"
python3 scripts/plan.py --config "$CONFIG" --cells "$CELLS" --output "$OUT/map" "$@" 2>&1 \
  | grep --line-buffered -v "^sweep ━\|^\[ok\]" | tail -60
kill $saver 2>/dev/null
pack map.tar.gz && rm -f "$OUT/map.partial.tar.gz"
