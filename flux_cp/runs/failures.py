"""How a run fails: error kinds, exit codes, a stall watchdog, and process-tree clean-up.

A run ends in one of these ways; summary.json records `error_kind`, the launcher exits with its code,
and the sweep reads both (summary.json first: the launcher may be killed before it can exit cleanly).
"""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

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


def error_line(exc: BaseException, limit: int = 500) -> str:
    """One line; a long one keeps its start and its end (torch.compile appends the user frames after the message,
    the innermost, where it failed, last)."""
    lines = [ln.strip() for ln in f"{type(exc).__name__}: {exc}".splitlines() if ln.strip()]
    line = " ".join(lines)
    return line if len(line) <= limit else f"{line[: limit * 3 // 5]} ... {line[-(limit * 2 // 5 - 5):]}"


def error_trace(exc: BaseException, limit: int = 20_000) -> str:
    """The whole traceback (its last `limit` characters) for the rank's error file: the one line cannot hold it."""
    import traceback

    return "".join(traceback.format_exception(exc))[-limit:]


def out_of_space(exc: BaseException | None) -> bool:
    """The error, or one it happened while handling, is a full disk, quota or file-size limit."""
    import errno

    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# ---------------------------------------------------------------- processes


def remove_heartbeats(out: Path) -> None:
    """Every rank's heartbeat file in the run's folder, and any half-written one (the run is over: nothing is in a
    step any more)."""
    for f in Path(out).glob(HEARTBEAT.format("*").removesuffix(".json") + ".*"):
        f.unlink(missing_ok=True)


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

    With a heartbeat file set (the run's folder, per rank), it also writes there every POLL_S what this
    rank is doing: the step it is in, since when, and where its main thread is (file:line). When a run
    stalls or a rank dies, the rank that notices reads them all (`culprit`) to name the rank at fault.
    """

    def __init__(self, timeout_s: float, on_fire=None, grace_s: float | None = None):
        super().__init__(daemon=True, name="flux-cp-watchdog")
        self.limit_s = timeout_s + (grace_s if grace_s is not None else max(5.0, 0.1 * timeout_s))
        self.on_fire = on_fire  # on_fire(exc, at) once before exiting, e.g. to record the timeout in summary.json
        self._last = time.monotonic()
        # not `_stop`: threading.Thread._stop() is a method, called on every other thread in a forked child
        # (DataLoader workers): an Event there is `TypeError: 'Event' object is not callable`
        self._halt = threading.Event()
        self.heartbeat: Path | None = None  # set once the rank is known (callbacks/guard.py)
        self.step, self._since = None, time.time()

    def beat(self, step: int | None = None) -> None:
        self._last, self._since = time.monotonic(), time.time()
        self.step = step if step is not None else self.step

    def stop(self) -> None:
        self._halt.set()
        if self.heartbeat is not None:
            self.heartbeat.unlink(missing_ok=True)

    def write_heartbeat(self) -> None:
        beat = {"pid": os.getpid(), "step": self.step, "since": self._since, "where": _where(), "time": time.time()}
        tmp = self.heartbeat.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(beat))
            os.replace(tmp, self.heartbeat)
        except OSError:  # the folder is gone or full: the watchdog's own job goes on
            pass

    def run(self) -> None:
        while not self._halt.wait(POLL_S):
            if self.heartbeat is not None:
                self.write_heartbeat()
            if time.monotonic() - self._last < self.limit_s:
                continue
            try:
                if self.on_fire is not None:
                    where = _where()
                    own = "torch/" not in where  # stuck in its own code, not waiting for other ranks: the culprit
                    self.on_fire(TimeoutError(f"watchdog: stalled in step {self.step} at {where}: no training step "
                                              f"progressed within {self.limit_s:.0f} s"), self._since if own else None)
            finally:
                kill_tree(os.getpid())
                os._exit(EXIT_TIMEOUT)


POLL_S = 0.5
HEARTBEAT = ".heartbeat-rank{}.json"  # in the run's folder, one per rank while it runs


def _where() -> str:
    """file:line function of the main thread's innermost frame."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}" if frame else "?"


def _short(path: str) -> str:
    parts = Path(path).parts
    for anchor in ("site-packages", "flux_cp", "callbacks", "scripts"):
        if anchor in parts:
            i = parts.index(anchor)
            return str(Path(*parts[i + (anchor == "site-packages"):]))
    return Path(path).name


def culprit(out: Path, world_size: int, recorded: set[int]) -> dict | None:
    """The rank a stalled or broken run waited for, from the ranks' heartbeats: one whose process is gone, else
    the one in the earliest step that is not waiting inside torch (a collective, backward's gradient sync), as
    an error entry (culprit's rank, kind, line). None when they do not tell (e.g. every rank waits in torch), or
    for ranks in `recorded` (they reported their own error)."""
    import psutil

    beats = {}
    for r in range(world_size):
        try:
            beats[r] = json.loads((Path(out) / HEARTBEAT.format(r)).read_text())
        except (OSError, ValueError):
            continue
    for r, b in sorted(beats.items()):
        try:
            gone = psutil.Process(b["pid"]).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        if gone and r not in recorded:
            return {"error_rank": r, "error_kind": "failed", "time": b["time"],
                    "error": f"rank {r} died, last seen in step {b['step']} (its process ended with no error: killed?)"}
    now = time.time()  # a live rank's heartbeat older than a few polls does not say where it is now
    stuck = [(b["step"] if b["step"] is not None else -1, r) for r, b in beats.items()
             if "torch/" not in b["where"] and r not in recorded and now - b["time"] < 4 * POLL_S]
    if not stuck or len(stuck) == len(beats):  # nobody waits for anybody: no single rank to blame
        return None
    _, r = min(stuck)
    b = beats[r]
    return {"error_rank": r, "error_kind": "timeout", "time": b["since"],
            "error": f"rank {r} stalled in step {b['step']} at {b['where']} (the other ranks waited for it)"}
