"""The first Ctrl-C or SIGTERM ends a run within seconds, wherever its main thread is.

Python runs a signal's handler in the main thread between bytecodes: inside one long C++ call (a CPU backward at
Flux's dims: 13 minutes) it waits for the call to end, and Lightning's Ctrl-C path then tears its strategy down
(seconds to minutes) while further signals are ignored. Here the interpreter's C-level handler writes the signal's
number to a wakeup pipe (signal.set_wakeup_fd), which wakes a thread at once (torch's ops release the GIL); that
thread freezes the other ranks (SIGSTOP: nothing they write can land after the record, and to this process's main
thread they are merely slow, not dead), runs the run's stop hooks (summary.json `complete: false` with the steps read
so far, the lock and heartbeat files removed), ends the other ranks and leaves with os._exit: no atexit hook runs,
so wandb's cannot print a traceback from a run whose service the same Ctrl-C has already stopped.

    guard = install(launcher=True)        # the CLI's process, before anything slow
    guard.add(lambda signum: ...)         # what this process must leave on disk when stopped
"""

import os
import signal
import sys
import threading
import time

from flux_cp.runs.failures import EXIT_INTERRUPTED, kill_tree

SIGNALS = (signal.SIGINT, signal.SIGTERM)
CHILD_GRACE_S = 3.0  # a rank that is not the launcher waits this long for the launcher to end it (a Ctrl-C reaches all)
FREEZE_WAIT_S = 1.0  # the launcher waits this long for the other ranks to be frozen before its hooks run
DEADLINE_S = 6.0  # the launcher's hooks (summary.json, lock) get this long; then it exits regardless
_guard = None


def _noop(signum, frame):  # the stop thread acts; the main thread carries on until the process exits
    pass


class StopGuard:
    def __init__(self, launcher: bool, prog: str):
        self.launcher, self.prog = launcher, prog
        self.hooks: list = []
        self.final_hooks: list = []  # after every other: the run folder's lock
        self.stopping = threading.Event()
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._previous = {s: signal.signal(s, _noop) for s in SIGNALS}
        self._previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self._fds = (r, w)
        threading.Thread(target=self._watch, daemon=True, name="flux-cp-stop").start()

    def add(self, hook, final: bool = False) -> None:
        """hook(signum): run by the stop thread, in order (final ones last), each on its own (one failing does not
        stop the next)."""
        (self.final_hooks if final else self.hooks).append(hook)

    def _watch(self) -> None:
        signum = None
        while signum is None:  # the pipe carries every signal Python handles (a SIGCHLD too, where one is handled)
            try:
                data = os.read(self._fds[0], 64)
            except OSError:  # closed by uninstall
                return
            if not data:
                return
            signum = next((b for b in data if b in SIGNALS), None)
        self.stopping.set()
        if not self.launcher:  # a Ctrl-C reaches every rank: the launcher records the run and ends this one
            time.sleep(CHILD_GRACE_S)
            os._exit(EXIT_INTERRUPTED)
        name = signal.Signals(signum).name
        print(f"{self.prog}: {name}{' (Ctrl-C)' if signum == signal.SIGINT else ''}: stopping", file=sys.stderr,
              flush=True)
        threading.Timer(DEADLINE_S, os._exit, (EXIT_INTERRUPTED,)).start()  # a hook that hangs cannot keep the run
        # Frozen, not killed: a rank still running rewrites its heartbeat after the hooks removed it (a flaky test
        # showed it), and a killed one would fail this process's main thread's collective, which then records a
        # 'rank died' error over the interruption.
        _freeze_children(FREEZE_WAIT_S)
        for hook in self.hooks + self.final_hooks:
            try:
                hook(signum)
            except Exception as e:  # what the others leave on disk still matters
                print(f"{self.prog}: while stopping: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        kill_tree(os.getpid())  # the other ranks Lightning started, wandb's service
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(EXIT_INTERRUPTED)

    def uninstall(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        for s, h in self._previous.items():
            signal.signal(s, h)
        for fd in self._fds:
            os.close(fd)


def _freeze_children(timeout_s: float) -> None:
    """SIGSTOP this process's descendants (the other ranks Lightning started, wandb's service) and wait, up to
    timeout_s, until each is stopped or gone."""
    import psutil

    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.NoSuchProcess:
        return
    kill_tree(os.getpid(), signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        while time.monotonic() < deadline:
            try:
                if p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)


def install(launcher: bool, prog: str = "train_bench.py") -> StopGuard:
    """Called from the main thread of the process the user (or a launcher) started."""
    global _guard
    _guard = StopGuard(launcher, prog)
    return _guard


def active() -> StopGuard | None:
    """The installed guard, if any (a sweep's in-process runs have none: the sweep handles its own signals)."""
    return _guard


def handler():
    """The Python-level handler the guard needs in place (a callback that resets SIGTERM puts this back)."""
    return _noop
