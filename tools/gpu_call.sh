#!/usr/bin/env bash
# One device call around tools/gpu_session.sh: the wheels installed, the session stopped in time to pack what it
# measured, and a later call resuming where this one was cut (the sweep does not rerun a complete run).
#   tools/gpu_call.sh DEADLINE_S [tests] SUITE... [tests]        (run by the device; carry .whl, .cache, devres)
#   devres/resume.tar.gz, if carried: an earlier call's results.tar.gz, unpacked first (its complete runs are kept)
#   -> $OUT/results.tar.gz (every suite's folder, tests.log), $OUT/session.log, $OUT/compile_cache.bin.xz: 3 flat
#      files (a device call returns at most 8)
set -u
deadline=${1:?"usage: tools/gpu_call.sh DEADLINE_S [tests] SUITE..."}; shift
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
work=/tmp/gpu_call; mkdir -p "$work"
[ -f devres/resume.tar.gz ] && tar xzf devres/resume.tar.gz -C "$work"
# its own session (process group), so that one signal reaches the sweep and every process it started
OUT=$work setsid tools/gpu_session.sh "$@" > "$work.out" 2>&1 &
pid=$!
end=$((SECONDS + deadline))
while kill -0 $pid 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 1; done
if kill -0 $pid 2>/dev/null; then
  echo "gpu_call.sh: ${deadline} s passed: stopping the session (the sweep records the run it was in)"
  kill -TERM -- -$pid 2>/dev/null
  for _ in $(seq 25); do kill -0 $pid 2>/dev/null || break; sleep 1; done
  kill -KILL -- -$pid 2>/dev/null
fi
# profiler traces stay behind (tens of MB at Flux.1's depth): a profiled run's breakdown is in its summary.json
(cd "$work" && tar czf "$OUT/results.tar.gz" --exclude=wandb --exclude=traces --exclude='*.tar.gz*' \
  --exclude='compile_cache*' .)
cp "$work/session.log" "$OUT/" 2>/dev/null
cp "$work/compile_cache.bin.xz" "$OUT/" 2>/dev/null
tail -60 "$work.out"
