"""Does --host-slowdown K make this host K times as slow at issuing work? Prints one JSON line per K.

    python tools/host_slowdown.py               # K = 1.5 and 2, five alternations each
    python tools/host_slowdown.py --k 1.25 3    # other settings

The run's own host probe (tiny torch ops: Python and ATen's dispatch, what a GPU step's host does; its mean over tens
of ms, which the core's share sets) is taken alternately outside and inside the emulation. The share is relative to
whatever else runs on the core, so each line carries the spread of the plain probes: a spread over ~10% means another
process was on the core and the ratio reads low. A benchmark, not a test: on a loaded 2-core CI machine the same
check read 1.14-1.52x for 1.5 (spread 28-64%).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from flux_cp.measure.host_load import slowed_host  # noqa: E402
from flux_cp.runs.results import host_probe  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=float, nargs="+", default=[1.5, 2.0], help="--host-slowdown settings to measure")
    p.add_argument("--repeats", type=int, default=5, help="plain/slowed alternations per setting")
    a = p.parse_args()
    for k in a.k:
        plain, slowed = [], []
        for _ in range(a.repeats):
            plain.append(host_probe()["mean_us"])
            with slowed_host(k):
                host_probe(n=500, reps=1)  # the busy loops are running
                slowed.append(host_probe()["mean_us"])
        print(json.dumps({"k": k, "ratio": round(statistics.median(slowed) / statistics.median(plain), 3),
                          "plain_spread": round((max(plain) - min(plain)) / min(plain), 3),
                          "plain_us": [round(x, 3) for x in plain], "slowed_us": [round(x, 3) for x in slowed]}))


if __name__ == "__main__":
    main()
