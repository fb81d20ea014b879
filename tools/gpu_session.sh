#!/usr/bin/env bash
# A device call: named benchmark suites (configs/suites/<suite>.yaml), all in one scripts/sweep.py process (imports
# once; each run in that process, --in-process), each into its own results folder, and the GPU tests if named.
# Nothing here is a benchmark of its own: suites are.
#   OUT=/some/dir tools/gpu_session.sh [tests] SUITE... [tests]   e.g.  tests flux_user flux_recipe_best
#   (the suites, the question each answers and the suites they replaced: configs/suites/README.md)
#   (tests named first run first; named after a suite, they run after the suites)
#   SWEEP_ONLY='simulate_world-8_*,...' runs a slice of each suite (scripts/sweep.py --only: run-name globs)
#   -> $OUT/session.log, $OUT/suites.tar.gz (<suite>/sweep.json, one folder per run: summary.json, train_bench.log)
set -u
if ! python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "gpu_session.sh: no CUDA device is visible here: run it on the GPU machine" >&2
  exit 2
fi
suites=(); files=(); tests=0; tests_first=0; missing=()
for s in "$@"; do
  if [ "$s" = tests ]; then tests=1; [ ${#suites[@]} -eq 0 ] && tests_first=1
  else suites+=("$s"); files+=("configs/suites/$s.yaml"); [ -f "configs/suites/$s.yaml" ] || missing+=("$s"); fi
done
if [ ${#missing[@]} -gt 0 ]; then  # before any device time goes: a retired or merged name says where it went
  echo "gpu_session.sh: no suite ${missing[*]} in configs/suites/ (configs/suites/README.md: the suites, and where" \
       "retired or merged ones went)" >&2
  exit 2
fi
OUT=${OUT:-runs/gpu_session}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_SILENT=true
# Compiled kernels carried between calls (flux_cp/train/compile_cache.py): earlier calls' $OUT/compile_cache.bin.xz, each
# put in .cache/ under its own name (ignored; a call saves only what it used) and carried, are loaded first; this
# call's is written to $OUT (one of its 8 files).
export FLUX_CP_COMPILE_CACHE_IN=${FLUX_CP_COMPILE_CACHE_IN:-.cache/*.bin.xz}
export FLUX_CP_COMPILE_CACHE_OUT=${FLUX_CP_COMPILE_CACHE_OUT:-$OUT/compile_cache.bin.xz}
log() { echo "== $(date -u +%FT%TZ) $*"; }
# The GPU tests are mostly train_bench subprocesses (~15 s of imports each): 4 xdist workers share the one GPU; those
# that time kernels against a plain script (marked exclusive: a neighbour's kernels moved one 33%) run alone after.
# Each test's outcome goes to $OUT/tests.log as it ends (-v): a call cut at its limit still returns what passed.
# GPU_TESTS_K='fp8 or lora' runs the tests of the code that changed (pytest -k), when a call has no room for all.
run_tests() {
  log "pytest -m gpu ${GPU_TESTS_K:+-k '$GPU_TESTS_K'}"
  python3 -m pytest -m "gpu and not exclusive" ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} -v -rfE --tb=short -p no:cacheprovider -n "${GPU_TEST_WORKERS:-4}" \
    tests/ 2>&1 | grep --line-buffered -v "PytestBenchmarkWarning\|warner(" | tee "$OUT/tests.log" | tail -25
  python3 -m pytest -m "gpu and exclusive" ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} -v -rfE --tb=short -p no:cacheprovider tests/ 2>&1 \
    | grep --line-buffered -v "PytestBenchmarkWarning\|warner(" | tee -a "$OUT/tests.log" | tail -8
}
# The device returns flat files only, at most 8 of them (a 9th made a call lose its suites.tar.gz, 2026-12-04), and a
# call cut at its limit returns what $OUT holds: keep a tarball fresh.
(while sleep 30; do tar czf "$OUT/partial.tar.gz.tmp" -C "$OUT" --exclude=wandb --exclude='*.tar.gz*' --exclude='compile_cache*' . 2>/dev/null \
  && mv "$OUT/partial.tar.gz.tmp" "$OUT/partial.tar.gz"; done) &
saver=$!
trap 'kill $saver 2>/dev/null' EXIT
{
  log device
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, lightning, diffusers; print('torch', torch.__version__, 'lightning', lightning.__version__, 'diffusers', diffusers.__version__)"
  if [ $tests = 1 ] && [ $tests_first = 1 ]; then run_tests; fi  # "tests SUITE...": tests first
  if [ ${#suites[@]} -gt 0 ]; then
    log "suites ${suites[*]}"
    # an in-process sweep has no isolation: a crash in the driver takes the process (2026-12-06, H100: a general
    # protection fault in libcuda starting a run); killed by a signal other than Ctrl-C/SIGTERM, it resumes once
    for attempt in 1 2; do
      python3 scripts/sweep.py "${files[@]}" --output-root "$OUT" --in-process ${SWEEP_ONLY:+--only "$SWEEP_ONLY"} \
        2>&1 | grep -v "^sweep ━" | tail -80
      rc=${PIPESTATUS[0]}
      [ "$rc" -gt 128 ] && [ "$rc" != 130 ] && [ "$rc" != 143 ] && [ $attempt = 1 ] || break
      log "the sweep died (exit $rc): resuming it (complete runs are kept)"
    done
    # one file: the device returns few, flat files
    (cd "$OUT" && tar czf suites.tar.gz --exclude=wandb "${suites[@]}" && rm -f partial.tar.gz)
  fi
  if [ $tests = 1 ] && [ $tests_first = 0 ]; then run_tests; fi
  log done
} 2>&1 | tee -a "$OUT/session.log"
