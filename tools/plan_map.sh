#!/usr/bin/env bash
# The decision map on a lent GPU: scripts/plan.py for each cell S:B:W (sequence length, global batch, GPUs), each
# cell's plans in one process, its plan.json and run summaries into $OUT/map/<cell>/, then one tarball ($OUT/map.tar.gz;
# a call cut at its limit still returns $OUT/map.partial.tar.gz).
#   OUT=/some/dir CELLS="4608:1:8 4608:8:8" tools/plan_map.sh [plan.py args...]   e.g. --builds eager
set -u
OUT=${OUT:-runs/plan_map}; mkdir -p "$OUT/map"
export PYTHONUNBUFFERED=1 WANDB_SILENT=true
CONFIG=${CONFIG:-configs/flux_4608.yaml}
pack() { tar czf "$OUT/$1.tmp" -C "$OUT" --exclude=wandb --exclude='*.pt' map 2>/dev/null && mv "$OUT/$1.tmp" "$OUT/$1"; }
for cell in ${CELLS:?give CELLS=\"S:B:W ...\"}; do
  IFS=: read -r S B W <<< "$cell"
  echo "== $(date -u +%FT%TZ) cell S=$S B=$B W=$W"
  python3 scripts/plan.py --config "$CONFIG" --seq-len "$S" --global-batch "$B" --world "$W" \
    --output "$OUT/map/S$S-B$B-W$W" "$@" 2>&1 | grep -v "^sweep ━\|^\[ok\]" | tail -40
  pack map.partial.tar.gz
done
pack map.tar.gz && rm -f "$OUT/map.partial.tar.gz"
