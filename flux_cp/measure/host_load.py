"""A slower host, emulated (--host-slowdown K): this process pinned to one core that K - 1 busy loops share.

At W >= 2 a rank's step can be host bound: the host issues the step's kernels about as fast as the device runs
them, so the speedup a user sees depends on their CPU's single-thread speed as much as on the GPU. On one machine
that speed is fixed; sharing the core that issues the kernels with K - 1 spinning processes gives the host about
1/K of it (Linux's scheduler time-slices them), while the device and its kernels stay as they are. The run records
the setting, so a report can hold such steps against others of the same slowdown only.
"""

import contextlib
import os
import subprocess
import sys

# spins while its parent lives: a run killed outright leaves no spinner behind
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"


@contextlib.contextmanager
def slowed_host(k: int):
    """Pin this process (all its threads) to one core and run k - 1 busy loops on it; undone on exit."""
    if k <= 1:
        yield None
        return
    before = os.sched_getaffinity(0)
    core = max(before)  # the highest core this process may use: away from core 0's interrupts
    spinners = []
    try:
        for _ in range(k - 1):
            spinners.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL,
                                             preexec_fn=lambda: os.sched_setaffinity(0, {core})))
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
