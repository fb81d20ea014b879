"""Where a run's peak GPU memory sits: scripts/train_bench.py in this process with the CUDA caching allocator's
history on, then the blocks live at the trace's peak, summed by the Python frames that allocated them.

    python tools/memory_peak.py --config configs/flux_4608.yaml --accelerator gpu --harness bare --cp ulysses \
        --weights zero2 --simulate-world 2 --warmup-steps 2 --steps 2 --wandb-mode disabled --output /tmp/mp

(every argument is train_bench.py's). Found on the H200 (docs/archive/2026-12-04e-h200-session.md): a zero2 run alone
peaked at 9.3 GiB where the in-process sweep had reported 52 GiB, earlier runs' state never freed.
"""

import collections
import runpy
import sys
from pathlib import Path

import torch

TOP = 25


def _where(frames: list[dict], n: int, ours: bool) -> str:
    if ours:  # the project's frames: which of its lines asked
        frames = [f for f in frames if any(k in f["filename"] for k in ("flux_cp", "scripts/", "callbacks"))]
    return " < ".join(f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in frames[:n])


def main() -> int:
    if not torch.cuda.is_available():
        print("memory_peak.py: no CUDA device is visible: it reads the CUDA caching allocator's history",
              file=sys.stderr)
        return 2
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    sys.argv = ["train_bench.py", *sys.argv[1:]]
    try:
        runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "train_bench.py"), run_name="__main__")
    except SystemExit:
        pass
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    live, cur, peak, at = {}, 0, 0, -1
    for i, e in enumerate(trace):  # replay allocations and completed frees to find the peak
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            cur -= live.pop(e["addr"])
        if cur > peak:
            peak, at = cur, i
    live = {}
    for e in trace[:at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    size, count = collections.Counter(), collections.Counter()
    for e in live.values():
        fr = e.get("frames", [])
        key = f"{_where(fr, 2, False)} || {_where(fr, 3, True)} || stream {e.get('stream')}"
        size[key] += e["size"]
        count[key] += 1
    print(f"max allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB; peak in the trace "
          f"{peak / 2**30:.2f} GiB (event {at} of {len(trace)}); live there, by allocating frames:")
    for key, v in size.most_common(TOP):
        print(f"{v / 2**30:8.2f} GiB {count[key]:5d}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
