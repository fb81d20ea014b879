"""A slower host, emulated (--host-slowdown K): this process pinned to one core shared with busy loops.

At W >= 2 a rank's step can be host bound: the host issues the step's kernels about as fast as the device runs
them, so the speedup a user sees depends on their CPU's single-thread speed as much as on the GPU. On one machine
that speed is fixed; sharing the core that issues the kernels with spinning processes gives the host a share of it
(Linux's scheduler time-slices runnable tasks in proportion to their weights, set by their nice levels), while the
device and its kernels stay as they are. K - 1 busy loops of this process's weight (nice 0) give it 1/K: int(K - 1)
of them at nice 0, and for a fractional rest one more at the nice level whose weight is nearest 1024 x that rest
(K = 1.5: nice 3, weight 526, a nominal share of 1024 / 1550 = 1/1.51). plan(K) says what is applied; the run's
host probe (summary.json host_speed) measures what it did, and that measured speed, not K, is the report's axis.
"""

import contextlib
import functools
import math
import os
import subprocess
import sys

# spins while its parent lives: a run killed outright leaves no spinner behind
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"
# Linux CFS task weights by nice level 0..19 (kernel/sched/core.c, sched_prio_to_weight)
NICE_WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15)


def plan(k: float) -> dict:
    """The busy loops that leave this process ~1/k of one core: their nice levels, and the share their weights give
    (nominal: the scheduler's accounting; other tasks on the core and this process's own threads are not in it)."""
    full = int(k - 1 + 1e-9)  # K = 2: one loop at nice 0, as before fractional settings
    rest = 1024 * (k - 1 - full)
    nices = [0] * full
    if rest >= NICE_WEIGHTS[-1] / 2:  # a rest below half the lightest weight: no loop
        nices.append(min(range(len(NICE_WEIGHTS)), key=lambda n: abs(NICE_WEIGHTS[n] - rest)))
    share = 1024 / (1024 + sum(NICE_WEIGHTS[n] for n in nices))
    return {"setting": k, "spinner_nice": nices, "nominal_share": share, "nominal_slowdown": 1 / share,
            "method": "pinned to one core with busy loops at these nice levels (CFS weights)"}


def applied(k: float) -> dict | None:
    """summary.json's `host_load`: what --host-slowdown k applied (None: the host as it is)."""
    return plan(k) if k > 1 and plan(k)["spinner_nice"] else None


def _spinner_setup(core: int, nice: int) -> None:  # in the spinner, before it runs
    os.nice(nice)
    os.sched_setaffinity(0, {core})


@contextlib.contextmanager
def slowed_host(k: float):
    """Pin this process (all its threads) to one core and run plan(k)'s busy loops on it; undone on exit."""
    if not math.isfinite(k) or not applied(k):
        yield None
        return
    before = os.sched_getaffinity(0)
    core = max(before)  # the highest core this process may use: away from core 0's interrupts
    spinners = []
    try:
        for nice in plan(k)["spinner_nice"]:
            spinners.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL,
                                             preexec_fn=functools.partial(_spinner_setup, core, nice)))
        _pin_all_threads({core})
        yield core
    finally:
        for p in spinners:
            p.kill()
            p.wait()
        _pin_all_threads(before)


def _pin_all_threads(cores: set[int]) -> None:
    # sched_setaffinity(0) sets the calling thread only: torch's and CUDA's threads started before are moved too
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cores)
