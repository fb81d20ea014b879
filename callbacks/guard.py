"""GuardCallback: keeps a run's failure bounded and recorded.

- tells the stall watchdog (flux_cp.runs.failures.Watchdog) at every step boundary that steps progress, and
  where this rank's heartbeat goes (the run's folder: which rank stalled or died, flux_cp.runs.failures.culprit);
- without the command line's stop guard (flux_cp/runs/interrupt.py; e.g. a sweep's in-process runs), turns SIGTERM
  into a `Terminated` (a KeyboardInterrupt) in the main thread, so that it takes
  Lightning's Ctrl-C path: on_exception (summary.json flushed, `complete: false`), then the other
  ranks are killed. Lightning's own SIGTERM handler is replaced: it broadcasts inside the signal
  handler, which deadlocks against a rank waiting in another collective until the process-group
  timeout;
- once the launcher is on its exception path, stands Lightning's child-process observer down: it would SIGKILL
  this process within 5 s of another rank's death, before the run's error (the rank that died, named from the
  heartbeats) is recorded; the launcher ends the other ranks itself (scripts/train_bench.py).
"""

import signal
import threading
from pathlib import Path

from lightning.pytorch import Callback

from flux_cp.runs import interrupt
from flux_cp.runs.failures import HEARTBEAT, Terminated, Watchdog


def _raise_terminated(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: shutting down already
    raise Terminated("SIGTERM")


def _stand_down_child_observer() -> None:
    """Lightning's launcher thread that SIGKILLs every process once a rank exits non-zero (_ChildProcessObserver, a
    private class: found by its thread's name; skipped where absent): its next poll ends its loop instead."""
    for t in threading.enumerate():
        if t.name == "child-process-observer" and callable(getattr(t, "_run", None)):
            t._run = lambda: True


class GuardCallback(Callback):
    def __init__(self, watchdog: Watchdog, out: Path | None = None):
        self.watchdog = watchdog
        self.out = out

    def on_train_start(self, trainer, pl_module):  # after Lightning registered its signal handlers
        # the command line's stop guard (flux_cp/runs/interrupt.py) acts from its own thread: its handler back in place
        signal.signal(signal.SIGTERM, interrupt.handler() if interrupt.active() else _raise_terminated)
        if self.out is not None:
            self.watchdog.heartbeat = Path(self.out) / HEARTBEAT.format(trainer.global_rank)
        self.watchdog.beat()
        if self.out is not None:  # now, not at the watchdog's next poll: a rank may die within its first steps
            self.watchdog.write_heartbeat()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.watchdog.beat(batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.watchdog.beat(batch_idx)

    def on_exception(self, trainer, pl_module, exception):
        _stand_down_child_observer()  # (the thread lives in the launcher only)
