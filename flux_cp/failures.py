"""How a run fails: error kinds, exit codes, a stall watchdog, and process-tree clean-up.

A run ends in one of these ways; summary.json records `error_kind`, the launcher exits with its code,
and the sweep reads both (summary.json first: the launcher may be killed before it can exit cleanly).
"""

import os
import signal
import threading
import time

EXIT_FAILED = 1
EXIT_CONFIG = 2  # ConfigError: bad input, nothing ran
EXIT_OOM = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130  # SIGINT / SIGTERM: the shell's 128 + SIGINT
EXIT_CODES = {"failed": EXIT_FAILED, "oom": EXIT_OOM, "timeout": EXIT_TIMEOUT, "interrupted": EXIT_INTERRUPTED}
KIND_OF_EXIT = {v: k for k, v in EXIT_CODES.items()}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread (callbacks/guard.py) to take Lightning's Ctrl-C shutdown path."""


_OOM_TEXT = ("out of memory", "can't allocate memory", "not enough memory")
_TIMEOUT_TEXT = ("timed out", "timeout", "watchdog")


def error_kind(exc: BaseException) -> str:
    """oom | timeout | interrupted | failed, for an exception raised inside a run."""
    import torch

    text = str(exc).lower()
    if isinstance(exc, torch.OutOfMemoryError | MemoryError) or any(t in text for t in _OOM_TEXT):
        return "oom"
    if isinstance(exc, KeyboardInterrupt | SystemExit):  # Lightning's SIGTERMException is a SystemExit
        return "interrupted"
    if isinstance(exc, TimeoutError) or any(t in text for t in _TIMEOUT_TEXT):  # e.g. gloo/NCCL PG timeout
        return "timeout"
    return "failed"


def error_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in f"{type(exc).__name__}: {exc}".splitlines() if ln.strip()]
    return " ".join(lines)[:500]


# ---------------------------------------------------------------- processes


def kill_tree(pid: int, sig: int = signal.SIGKILL, include_self: bool = False) -> None:
    """Signal every descendant of pid (the other ranks, in the launcher), and pid itself if asked."""
    import psutil

    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs + ([psutil.Process(pid)] if include_self else []):
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:  # exited meanwhile
            pass


# ---------------------------------------------------------------- watchdog


class Watchdog(threading.Thread):
    """Ends this process (and its child processes: other ranks, in the launcher) when no step boundary
    was reached for `timeout_s` plus a grace period, e.g. a rank hung outside any collective.

    The process-group timeout (same `timeout_s`) normally fires first and fails the run through the
    usual exception path; the watchdog is the backstop for what it cannot reach: the hung rank itself,
    or a rank stuck after its error (teardown, a collective in a signal handler).
    """

    def __init__(self, timeout_s: float, on_fire=None, grace_s: float | None = None):
        super().__init__(daemon=True, name="flux-cp-watchdog")
        self.limit_s = timeout_s + (grace_s if grace_s is not None else max(5.0, 0.1 * timeout_s))
        self.on_fire = on_fire  # called once before exiting, e.g. to record the timeout in summary.json
        self._last = time.monotonic()
        # not `_stop`: threading.Thread._stop() is a method, called on every other thread in a forked child
        # (DataLoader workers): an Event there is `TypeError: 'Event' object is not callable`
        self._halt = threading.Event()

    def beat(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            if time.monotonic() - self._last < self.limit_s:
                continue
            try:
                if self.on_fire is not None:
                    self.on_fire(TimeoutError(f"watchdog: no training step progressed within {self.limit_s:.0f} s"))
            finally:
                kill_tree(os.getpid())
                os._exit(EXIT_TIMEOUT)
