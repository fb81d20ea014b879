"""Sweeps run: each run of a sweep (flux_cp/runs/sweep_config.py: the YAML grid) one by one, indexed in sweep.json.

Each run is its own `scripts/train_bench.py` process group (Lightning launches its ranks) writing
<output>/<run>/summary.json and train_bench.log. sweep.json has the sweep's `status` (running | interrupted |
complete: every run ok | failed: some runs not) and `counts`, and lists every run: name, point, args, status
(pending | ok | oom | failed | timeout), finished (when it ended), duration_s, output, error, shape, exit_code (the
latest attempt's), and attempts: every time it ran, {exit_code, status, finished}, oldest first (a -15 from a first
attempt killed by SIGTERM stays there after a resume ran it whole).
A run whose summary.json is complete stays `ok` when the sweep is run again (resume), and is not run again; what
sweep.json recorded of it (exit_code, finished, duration_s, attempts, ...) is kept.
On Ctrl-C (SIGINT) or SIGTERM the sweep stops the running run (SIGTERM to its process group, which writes its
summary.json; SIGKILL after STOP_GRACE_S), records it, and leaves the rest pending: running it again resumes.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from flux_cp.runs.failures import EXIT_INTERRUPTED, HEARTBEAT, KIND_OF_EXIT, Terminated
from flux_cp.runs.results import write_json_atomic
from flux_cp.runs.sweep_config import ROOT, Run, Sweep

TRAIN_BENCH = ROOT / "scripts" / "train_bench.py"
STOP_GRACE_S = 30  # after Ctrl-C / SIGTERM, the current run's time to flush its summary.json
SWEEP_DEFINES = ("name", "point", "args", "output", "shape")  # a run's sweep.json fields from the sweep config


# ---------------------------------------------------------------- execution


def read_summary(out: Path) -> dict | None:
    try:
        return json.loads((Path(out) / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def is_complete(out: Path) -> bool:
    s = read_summary(out)
    return bool(s and s.get("complete"))


def _cuda_fault(out: Path) -> bool:
    """The run's summary.json records a failure of CUDA's (CUDA_STATE_LOST), which may have taken its process."""
    s = read_summary(out)
    return bool(s and not s.get("complete") and CUDA_STATE_LOST.search(s.get("error") or ""))


def _error_line(summary: dict | None, log: Path) -> str | None:
    if summary and summary.get("error"):
        return summary["error"]
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    hits = [ln for ln in lines if "error" in ln.lower()]
    return (hits or lines or [None])[-1]


def classify(rc: int, summary: dict | None, guard_fired: bool) -> str:
    """ok | oom | failed | timeout, from the run's summary.json first and its exit code second."""
    if guard_fired:
        return "timeout"
    if summary and summary.get("complete"):  # measured whole, whatever ended the process after (e.g. Ctrl-C)
        return "ok"
    kind = (summary or {}).get("error_kind") or KIND_OF_EXIT.get(rc, "failed")
    return kind if kind in ("oom", "timeout") else "failed"  # interrupted: failed, its error line says so


# A CUDA error (a failed CUDA graph capture among them) leaves the process's CUDA context or its RNG in a state the
# next in-process run inherits: on the H200 every run after a failed capture failed ("Offset increment outside graph
# capture", 2026-12-04). Out of memory is not one: the allocator recovers.
CUDA_STATE_LOST = re.compile(r"CUDA error|AcceleratorError|graph capture")


class Runner:
    """Runs a sweep's runs one by one, each in its own session (process group), keeping sweep.json current.

    in_process: train_bench's main(argv) to call for each run in this process instead (runs of one process each:
    --devices 1, simulated or not). torch, diffusers and Lightning are then imported once for the sweep, not once
    per run (on the H200 host: ~20 s of a ~25 s Flux run). No isolation: a run that hangs or is killed by the
    kernel takes the sweep with it; its summary.json says `wall_s.startup` counts from the run's start. After a run
    that failed with a CUDA error (CUDA_STATE_LOST), the rest run each in their own process."""

    def __init__(self, sweep: Sweep, console=None, poll_s: float = 0.5, in_process=None):
        self.sweep = sweep
        self.in_process = in_process
        self.index_path = sweep.output / "sweep.json"
        # backstop above train_bench's own watchdog: the run is killed after no sign of progress (a new summary.json, a
        # rank's next step in its heartbeat file) for this long
        self.guard_s = 2 * sweep.timeout_s + 60
        self.console = console
        self.poll_s = poll_s
        self.stop_signal: int | None = None
        self._proc: subprocess.Popen | None = None
        self._here = False  # a run is running in this process (in_process)
        prior = {}
        if self.index_path.is_file():
            prior = {r["name"]: r for r in json.loads(self.index_path.read_text()).get("runs", [])}
        self.records = [self._record(r, prior.get(r.name)) for r in sweep.runs]
        if in_process is not None and any(_cuda_fault(r.output) for r in sweep.runs):
            # an earlier attempt's run faulted on CUDA and its process died before switching (H200 2026-12-07: cuDNN
            # under LoRA aborted in a CUDA event's destructor): this attempt runs each run in its own process
            self.in_process = None
        # a slice (--only) keeps what earlier invocations recorded of the runs it leaves out: one index per folder
        chosen = {r.name for r in sweep.runs}
        self.kept = [r for name, r in prior.items() if name not in chosen] if sweep.only else []

    def _record(self, run: Run, prior: dict | None) -> dict:
        rec = {"name": run.name, "point": run.point, "args": run.args, "status": "pending", "finished": None,
               "duration_s": None, "output": str(run.output), "error": None, "shape": run.shape, "exit_code": None,
               "attempts": []}
        if prior and prior.get("args") == run.args:  # same run as last time: keep everything it recorded
            rec.update({k: v for k, v in prior.items() if k not in SWEEP_DEFINES})
            if "attempts" not in prior and prior.get("exit_code") is not None:  # a sweep.json from before attempts
                rec["attempts"] = [{k: prior.get(k) for k in ("exit_code", "status", "finished")}]
        return rec

    @staticmethod
    def _ended(rec: dict, **fields) -> None:
        """A run's attempt ended: its record takes the attempt's fields, and the attempt joins its attempts."""
        rec.update(fields)
        rec["attempts"] = [*(rec.get("attempts") or []), {k: rec[k] for k in ("exit_code", "status", "finished")}]

    def status(self, running: bool) -> str:
        if self.stop_signal is not None:
            return "interrupted"
        if running:
            return "running"
        return "complete" if all(r["status"] == "ok" for r in self.records + self.kept) else "failed"

    def write_index(self, running: bool = True) -> None:
        counts: dict[str, int] = {}
        for r in self.records + self.kept:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        index = {"schema": 1, "sweep": self.sweep.name, "config_file": self.sweep.file, "status": self.status(running),
                 "counts": counts, "updated": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": self.records + self.kept}
        if self.sweep.only:
            index["only"] = self.sweep.only  # this invocation ran a slice; "complete" still means every listed run ok
        write_json_atomic(self.index_path, index)

    def _on_signal(self, signum, frame):
        self.stop_signal = self.stop_signal or signum  # the first names the interruption
        if self._proc is not None and self._proc.poll() is None:
            _signal_group(self._proc.pid, signal.SIGTERM)  # train_bench flushes its summary.json and exits
        elif self._here:  # a run in this process, before it set handlers of its own: stopped as train_bench stops
            raise Terminated("SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt

    def run(self, progress=None) -> int:
        """Returns the number of runs that did not end ok (the sweep goes on past them)."""
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.write_index()
            total = progress.add_task("sweep", total=len(self.sweep.runs), run="") if progress else None
            for i, (run, rec) in enumerate(zip(self.sweep.runs, self.records)):
                if self.stop_signal is not None:
                    break
                label = f"{i + 1}/{len(self.sweep.runs)} {run.name}"
                if is_complete(run.output):  # done before (resume): stays ok, with when it ended
                    rec["status"], rec["error"] = "ok", None
                    rec["finished"] = rec["finished"] or _when(_mtime(run.output / "summary.json"))
                    label += " (done before)"
                elif self.in_process is not None:
                    self._execute_here(run, rec)
                else:
                    self._execute(run, rec, progress, label)
                self.write_index()
                self._log(f"[{rec['status']}] {label}" + (f": {rec['error']}" if rec["error"] else ""))
                if progress:
                    progress.advance(total)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.write_index(running=False)
        return sum(r["status"] != "ok" for r in self.records)

    def _execute(self, run: Run, rec: dict, progress, label: str) -> None:
        run.output.mkdir(parents=True, exist_ok=True)
        log = run.output / "train_bench.log"
        env = {**os.environ, "WANDB_SILENT": "true"}
        env.pop("LOCAL_RANK", None)
        t0 = time.monotonic()
        step_task = progress.add_task(label, total=run.steps, run=label) if progress else None
        with open(log, "w") as f:
            # Own session: the run's ranks form one process group, killed as a whole when it ends.
            self._proc = proc = subprocess.Popen([sys.executable, str(TRAIN_BENCH), *run.args], stdout=f,
                                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                                 start_new_session=True)
            guard_fired, last_beat, last_mtime, stopping, killed = False, t0, None, None, False
            while proc.poll() is None:
                time.sleep(self.poll_s)
                if self.stop_signal is not None:  # forwarded as SIGTERM; a run that ignores it is killed
                    stopping = stopping or time.monotonic()
                    if time.monotonic() - stopping > STOP_GRACE_S:
                        _signal_group(proc.pid, signal.SIGKILL)
                        killed = True
                mtime = (_mtime(run.output / "summary.json"), _steps(run.output))
                if mtime != last_mtime:  # a new summary.json (rank 0 rewrites it while measuring) or a rank's next step
                    last_beat, last_mtime = time.monotonic(), mtime
                    if progress and (s := read_summary(run.output)):
                        # steps so far (a run over fake collectives has no losses: its measured steps)
                        done = len(s.get("loss") or []) or len(s.get("per_step", {}).get("step_ms", []))
                        progress.update(step_task, completed=done)
                if time.monotonic() - last_beat > self.guard_s:
                    guard_fired = True
                    _signal_group(proc.pid, signal.SIGKILL)
            _signal_group(proc.pid, signal.SIGKILL)  # whatever of the run is left: no orphans
            self._proc = None
        if progress:
            progress.remove_task(step_task)
        summary = read_summary(run.output)
        status = classify(proc.returncode, summary, guard_fired)
        error = None if status == "ok" else _error_line(summary, log)
        if self.stop_signal is not None and status != "ok" and _stopped(proc.returncode, summary):
            error = self.interrupted_line() + (f" (SIGKILL: it ignored SIGTERM for {STOP_GRACE_S} s)" if killed
                                               else "")
        if guard_fired:
            error = f"no progress for {self.guard_s:.0f} s: run killed by the sweep"
        self._ended(rec, status=status, finished=_when(time.time()), duration_s=round(time.monotonic() - t0, 2),
                    error=error, exit_code=proc.returncode)

    def _execute_here(self, run: Run, rec: dict) -> None:
        """One run in this process (in_process), its output to its train_bench.log; state a run leaves behind (the
        process group, signal handlers, cached GPU memory) is cleared before the next."""
        import contextlib
        import gc

        import torch

        from flux_cp.runs.results import mark_run_start

        run.output.mkdir(parents=True, exist_ok=True)
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        t0 = time.monotonic()
        with open(run.output / "train_bench.log", "w") as f, contextlib.redirect_stdout(f), \
                contextlib.redirect_stderr(f):
            mark_run_start()
            try:
                self._here = True
                rc = self.in_process(list(run.args))
            except BaseException as e:  # noqa: BLE001  (the sweep goes on, as with a failed process)
                print(f"sweep: run raised {type(e).__name__}: {e}", file=f)
                rc = EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else 1
            finally:
                self._here = False
        for s, h in handlers.items():
            signal.signal(s, h)
        from flux_cp.runs.process_state import forget_process_groups

        forget_process_groups()  # and DeviceMesh's and DTensor's caches of its meshes
        # Dynamo's caches and counters from this run's compiled model (guards on its modules, recompile counts, the
        # fake group it traced): on an H200 whole-model graph runs after other compiled runs failed in tracing.
        torch.compiler.reset()
        gc.collect()
        lost = False
        if torch.cuda.is_available():
            try:
                torch.cuda.empty_cache()
            except RuntimeError:  # a sticky error (an illegal memory access, H100 2026-12-07): every later call fails
                lost = True
        summary = read_summary(run.output)
        status = classify(rc, summary, False)
        error = None if status == "ok" else _error_line(summary, run.output / "train_bench.log")
        if status != "ok" and _stopped(rc, summary):
            # train_bench's own handlers were in charge while it ran (SIGTERM: callbacks/guard.py): the sweep stops
            # with the run, named by the signal it took
            self.stop_signal = self.stop_signal or (signal.SIGTERM if "SIGTERM" in (error or "") else signal.SIGINT)
            error = self.interrupted_line()
        self._ended(rec, status=status, finished=_when(time.time()), duration_s=round(time.monotonic() - t0, 2),
                    error=error, exit_code=rc)
        if status != "ok" and (lost or CUDA_STATE_LOST.search(rec["error"] or "")):
            self.in_process = None
            self._log(f"sweep: {run.name} left this process's CUDA state unusable: the remaining runs each in their "
                      "own process")

    def interrupted_line(self) -> str:
        """What stopped the sweep, named once (the sweep forwards SIGTERM to its run whatever it got)."""
        return f"interrupted: the sweep got {signal_name(self.stop_signal)} and stopped this run"

    def _log(self, msg: str) -> None:
        if self.console is not None:
            self.console.print(msg, markup=False, highlight=False, soft_wrap=True)


def signal_name(signum: int | None) -> str:
    if signum is None:
        return "a signal"
    name = signal.Signals(signum).name
    return f"{name} (Ctrl-C)" if signum == signal.SIGINT else name


def _stopped(rc: int | None, summary: dict | None) -> bool:
    """The run ended because it was told to stop (its summary says interrupted, or no summary says otherwise and
    its exit code is the interrupted one, or a signal's), not on an error of its own."""
    kind = (summary or {}).get("error_kind")
    if kind is not None:
        return kind == "interrupted"
    return rc is None or rc < 0 or KIND_OF_EXIT.get(rc) == "interrupted"


def _when(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def _steps(out: Path) -> tuple:
    """The step each rank is in, from its heartbeat file (flux_cp/runs/failures.py: rewritten every POLL_S while it
    runs, its step advancing with the run): progress between summary.json writes."""
    steps = []
    for f in sorted(out.glob(HEARTBEAT.format("*"))):
        try:
            steps.append(json.loads(f.read_text()).get("step"))
        except (OSError, ValueError):
            pass
    return tuple(steps)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # start_new_session: the group id is the launcher's pid
    except (ProcessLookupError, PermissionError):
        pass
