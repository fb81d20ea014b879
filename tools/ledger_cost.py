"""The communication ledger's own cost: host microseconds a collective pays for being recorded.

    python tools/ledger_cost.py [--world 8] [--calls 4000]

One process as rank 0 of a W-rank job over torch's fake process group (collectives complete at once, so the
figures are the host's dispatch path alone): torch's functional all-gather + wait_tensor (the ring's
rotation) and a c10d all-reduce (DDP's buckets), bare, with the ledger's kernels registered but idle (what every
step paid until they were registered in instrumented steps only), and recording. Best of 5 rounds. In a run, an
instrumented step (out of step_ms) carries the recording cost once per collective; the H200 runs showed ~100-200 us
per collective there (docs/archive/2026-12-04b-h200-session.md), more than these calls alone.
"""

import argparse
import time

import torch
import torch.distributed as dist

from flux_cp.measure.ledger import CommLedger
from flux_cp.measure.timing import _Clock
from flux_cp.parallel.fake_group import init_fake_world


def _best_us(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--calls", type=int, default=4000)
    a = p.parse_args()
    init_fake_world(a.world, 0)
    x = torch.randn(1024)
    group = dist.group.WORLD.group_name

    def funcol():
        torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_gather_into_tensor(x, a.world, group))

    def c10d():
        dist.all_reduce(x)

    cases = {"funcol all_gather + wait": funcol, "c10d all_reduce": c10d}
    rows = {name: [_best_us(fn, a.calls)] for name, fn in cases.items()}
    ledger = CommLedger.get()
    ledger._attach()  # registered, not recording: as every step was before 2026-12-04
    for name, fn in cases.items():
        rows[name].append(_best_us(fn, a.calls))
    ledger.start(_Clock(cuda=False))  # a CPU step's clock, as StepTimer makes
    for name, fn in cases.items():
        rows[name].append(_best_us(fn, a.calls // 10))  # entries pile up while recording: fewer calls
    ledger.stop()
    print(f"fake group of {a.world}, torch {torch.__version__}, host us per call (best of 5)")
    print(f"{'':28}{'bare':>8}{'idle':>8}{'record':>8}")
    for name, (bare, idle, rec) in rows.items():
        print(f"{name:28}{bare:8.1f}{idle:8.1f}{rec:8.1f}")


if __name__ == "__main__":
    main()
