"""The host's speed over time: flux_cp.runs.results.host_op_us (us per tiny torch op) sampled every --every-s seconds.

    python tools/host_speed.py --seconds 8            # as the runs see it
    taskset -c 3 python tools/host_speed.py           # pinned to one core: is a slow spell a core's or the host's?

On the H200 machines lent here host_op_us was bimodal (~2.8 or ~5.2 us) within one call, and a host-bound step moved
with it. Prints one JSON line: the cores allowed, the median, min and max, the share of samples over 1.4 x the
fastest, and the samples.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from flux_cp.runs.results import host_op_us  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--every-s", type=float, default=0.1)
    a = p.parse_args()
    samples, t_end = [], time.monotonic() + a.seconds
    while time.monotonic() < t_end:
        samples.append(host_op_us(n=1000, reps=3))
        time.sleep(a.every_s)
    fast = min(samples)
    print(json.dumps({"cpus": sorted(os.sched_getaffinity(0)), "n": len(samples),
                      "median_us": round(statistics.median(samples), 3), "min_us": round(fast, 3),
                      "max_us": round(max(samples), 3),
                      "slow_share": round(sum(s > 1.4 * fast for s in samples) / len(samples), 3),
                      "samples_us": [round(s, 2) for s in samples]}))


if __name__ == "__main__":
    main()
