"""Sweeps: a YAML grid of train_bench runs, validated up front, run one by one, indexed in sweep.json.

    name: cpu-small                 # sweep id: default output sweeps/<name>, wandb group
    config: configs/tiny.yaml       # train_bench's --config for every run
    timeout_s: 120                  # per-run --timeout-s (stalled step -> `timeout`), unless base/axes set it
    base: {accelerator: cpu}        # settings shared by every run
    axes:                           # cartesian product, first axis slowest
      devices: [1, 2]               # any train_bench run flag (underscored) ...
      cp: [allgather-kv, ulysses]
      data.image_height: [8, 16]    # ... or a dotted model./data. key
    exclude: [{devices: 1, cp: ulysses}]   # optional: partial points to leave out
    include:                        # optional: more points, each entry a grid of its own (below)
      - {devices: 1, cp: none}

`include:` entries are written like `axes` (a bare value is one value; a list-valued setting's one value is
[[...]], as in `axes`). Each entry is crossed with the axes it does not name, and its settings apply over `base`:
with the axes above, `{devices: 1, cp: none}` adds devices-1_cp-none_image_height-8 and -16; a key that is not an
axis (e.g. `{cp: none, sdpa_backend: [auto, flash]}`) is a setting of those points only and part of their names.
This is how one suite holds points that differ in more than their axis values, such as the W=1 baselines of a
W >= 2 grid (`axes: {simulate_world: [2, 8]}` with `base: {cp: torch}`; `include: [{simulate_world: null, cp:
none}]`). A null value, anywhere, is a setting not passed: the config's value, or train_bench's default (here: no
simulated world, one real process). Include's points run first (the baselines a grid is divided by: a call cut at
its limit still has them), then the grid's. `exclude:` applies to both: it leaves out every point whose settings
(base, then the point's) hold all of its entry's values; its keys are axes or include keys. Two points with the
same settings are an error.

Each run is its own `scripts/train_bench.py` process group (Lightning launches its ranks) writing
<output>/<run>/summary.json and train_bench.log. sweep.json has the sweep's `status` (running | interrupted |
complete: every run ok | failed: some runs not) and `counts`, and lists every run: name, point, args, status
(pending | ok | oom | failed | timeout), finished (when it ended), duration_s, output, error, shape, exit_code.
A run whose summary.json is complete stays `ok` when the sweep is run again (resume), and is not run again; what
sweep.json recorded of it (exit_code, finished, duration_s, ...) is kept.
On Ctrl-C (SIGINT) or SIGTERM the sweep stops the running run (SIGTERM to its process group, which writes its
summary.json; SIGKILL after STOP_GRACE_S), records it, and leaves the rest pending: running it again resumes.
"""

import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from flux_cp.checks import resolve
from flux_cp.config import ConfigError, DataConfig, ModelConfig, RunConfig, parse_config
from flux_cp.runs.failures import EXIT_INTERRUPTED, HEARTBEAT, KIND_OF_EXIT, Terminated
from flux_cp.runs.results import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]
TRAIN_BENCH = ROOT / "scripts" / "train_bench.py"
SWEEP_KEYS = ("name", "config", "output", "timeout_s", "base", "axes", "exclude", "include")
RUN_KEYS = {f.name for f in dataclasses.fields(RunConfig)}
NESTED_KEYS = {k: {f.name for f in dataclasses.fields(c)} for k, c in (("model", ModelConfig), ("data", DataConfig))}
STOP_GRACE_S = 30  # after Ctrl-C / SIGTERM, the current run's time to flush its summary.json
SET_BY_SWEEP = ("output", "group")  # each run's folder and the sweep's wandb group
SWEEP_DEFINES = ("name", "point", "args", "output", "shape")  # a run's sweep.json fields from the sweep config


@dataclass
class Run:
    name: str
    point: dict  # this run's axis values
    args: list[str]  # train_bench's command line
    output: Path
    steps: int = 0  # warm-up + measured, from the resolved config (progress)
    shape: dict = field(default_factory=dict)  # seq_len, batch, world
    processes: int = 1  # the run's ranks on this machine and others (a simulated world is one)


@dataclass
class Sweep:
    name: str
    file: str
    output: Path
    runs: list[Run]
    timeout_s: float  # per run, unless base/axes set timeout_s
    only: list[str] = field(default_factory=list)  # run-name globs this invocation keeps (select()); empty: all


# ---------------------------------------------------------------- expansion and validation


def _setting_problem(key: str) -> str | None:
    """None if `key` names a train_bench setting (run flag with underscores, or model./data. key)."""
    head, _, leaf = key.partition(".")
    if leaf:
        if head in NESTED_KEYS and leaf in NESTED_KEYS[head]:
            return None
        return f"unknown setting {key!r} (model./data. keys: see configs/flux_4608.yaml)"
    if key in RUN_KEYS:
        return f"{key!r} is set by the sweep for each run" if key in SET_BY_SWEEP else None
    return f"unknown setting {key!r} (run settings: {', '.join(sorted(RUN_KEYS - set(SET_BY_SWEEP)))})"


def _flag(key: str, value) -> list[str]:
    flag = f"--{key}" if "." in key else "--" + key.replace("_", "-")
    if isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, list | dict):
        value = json.dumps(value)
    return [flag, str(value)]


def _slug(point: dict) -> str:
    parts = []
    for k, v in point.items():
        v = json.dumps(v, separators=(",", ":")) if isinstance(v, list | dict) else str(v).lower()
        parts.append(f"{k.split('.')[-1]}-{v}")
    return "_".join(parts).replace("/", "-") or "run"


def load_sweep(
    path: str | Path, output: str | None = None, timeout_s: float | None = None, *, cuda_available: bool, gpu_count: int
) -> Sweep:
    """Expand and check the whole sweep; every problem found is in one ConfigError (one per line)."""
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read sweep config ({_one_line(e)})") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a sweep config is a mapping with keys {', '.join(SWEEP_KEYS)}")
    errors = [f"unknown key {k!r} (sweep keys: {', '.join(SWEEP_KEYS)})" for k in spec if k not in SWEEP_KEYS]
    name = str(spec.get("name") or path.stem)
    base = spec.get("base") or {}
    axes = spec.get("axes")
    exclude = spec.get("exclude") or []
    include = spec.get("include") or []
    if not isinstance(base, dict):
        errors.append("base: must be a mapping of settings")
        base = {}
    if not isinstance(axes, dict) or not axes:
        errors.append("axes: needs at least one axis, e.g. `axes: {devices: [1, 2]}`")
        axes = {}
    bad = set()  # settings left out of the expansion below, so that it still finds every other problem
    for k, vals in axes.items():
        if not isinstance(vals, list) or not vals:
            errors.append(f"axes.{k}: empty axis (give a non-empty list of values)")
            bad.add(k)
    if not isinstance(exclude, list) or not all(isinstance(e, dict) for e in exclude):
        errors.append("exclude: must be a list of mappings (partial points)")
        exclude = []
    if not isinstance(include, list) or not all(isinstance(e, dict) and e for e in include):
        errors.append("include: must be a list of non-empty mappings (settings, each a value or a list of values)")
        include = []
    include = [{k: v if isinstance(v, list) else [v] for k, v in e.items()} for e in include]  # a bare value: one
    for i, e in enumerate(include):
        for k, vals in e.items():
            if not vals:
                errors.append(f"include[{i}].{k}: empty list (give a value or a non-empty list of values)")
                bad.add(k)
    varying = set(axes).union(*include)  # what exclude may name: an axis or an include key
    entries = (("base", base), ("axes", axes), *((f"include[{i}]", e) for i, e in enumerate(include)),
               *((f"exclude[{i}]", e) for i, e in enumerate(exclude)))
    for where, keys in entries:
        for k in keys:
            if problem := _setting_problem(k):
                errors.append(f"{where}.{k}: {problem}")
                bad.add(k)
            elif where.startswith("exclude") and k not in varying:
                errors.append(f"{where}.{k}: not an axis or an include key")
    config = Path(spec.get("config") or "")
    if not spec.get("config"):
        errors.append("config: missing (the train_bench config of every run, e.g. configs/tiny.yaml)")
    elif not config.is_file() and (ROOT / config).is_file():
        config = ROOT / config
    if not config.is_file() and spec.get("config"):
        errors.append(f"config: {spec['config']}: file not found")
    timeout_s = timeout_s or spec.get("timeout_s", RunConfig.timeout_s)  # the command line's, else the file's
    if not config.is_file() or not (axes := {k: v for k, v in axes.items() if k not in bad}):
        raise ConfigError("\n".join(errors))
    base = {k: v for k, v in base.items() if k not in bad}
    include = [e for e in include if not bad.intersection(e)]  # an entry with a bad setting: left out whole

    out = Path(output or spec.get("output") or Path("sweeps") / name)
    runs, point_errors, seen = [], {}, {}
    for point in _points(axes, include):
        settings = {"timeout_s": timeout_s, **base, **point}
        if any(all(k in settings and settings[k] == v for k, v in e.items()) for e in exclude):
            continue
        run_name = _slug(point)
        same = json.dumps(settings, sort_keys=True, default=str)
        if same in seen:
            errors.append(f"runs {seen[same]} and {run_name} have the same settings (an include entry repeats a "
                          "point: drop it, or exclude the point)")
            continue
        seen[same] = run_name
        args = ["--config", str(config)]
        for k, v in settings.items():
            args += [] if v is None else _flag(k, v)  # null: not passed (the config's value, or the default)
        args += ["--output", str(out / run_name), "--group", name]
        try:
            cfg = resolve(parse_config(args, cuda_available=cuda_available), cuda_available=cuda_available,
                          gpu_count=gpu_count)
        except ConfigError as e:
            point_errors.setdefault(str(e), []).append(run_name)
            continue
        shape = {"seq_len": cfg.data.seq_len, "batch": cfg.data.batch_size, "world": cfg.run.devices}
        runs.append(Run(run_name, point, args, out / run_name, cfg.run.warmup_steps + cfg.run.steps, shape,
                        cfg.run.devices * cfg.run.num_nodes))
    for msg, names in point_errors.items():
        errors.append(f"{_names(names)}: {msg}")
    if len({r.name for r in runs}) != len(runs):
        errors.append("two points give the same run name: make axis values distinct")
    if not runs and not errors:
        errors.append("exclude leaves no run")
    if errors:
        raise ConfigError("\n".join(errors))
    return Sweep(name, str(path), out, runs, float(timeout_s))


def _points(axes: dict, include: list[dict]):
    """Include's points (each entry crossed with the axes it does not name: axes first, in their order, then the
    entry's own keys), then the grid's."""
    for entry in include:
        grid = {k: entry.get(k, v) for k, v in axes.items()} | {k: v for k, v in entry.items() if k not in axes}
        for values in itertools.product(*grid.values()):
            yield dict(zip(grid, values))
    for values in itertools.product(*axes.values()):
        yield dict(zip(axes, values))


def _names(names: list[str]) -> str:
    return f"run {names[0]}" if len(names) == 1 else f"runs {names[0]} (+{len(names) - 1} more)"


def _one_line(e) -> str:
    return " ".join(str(e).split())


# ---------------------------------------------------------------- execution


def read_summary(out: Path) -> dict | None:
    try:
        return json.loads((Path(out) / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def is_complete(out: Path) -> bool:
    s = read_summary(out)
    return bool(s and s.get("complete"))


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


def select(sweep: Sweep, only: str) -> Sweep:
    """The sweep with only the runs whose names match one of `only`'s comma-separated globs (fnmatch, e.g.
    `simulate_world-8_*`): a slice of a suite that fits one device call. A glob that matches no run is an error."""
    import fnmatch

    globs = [g.strip() for g in only.split(",") if g.strip()]
    if not globs:
        raise ConfigError(f"--only {only!r}: give run-name globs, e.g. --only 'simulate_world-8_*' (--dry-run lists "
                          "the names)")
    if unmatched := [g for g in globs if not any(fnmatch.fnmatchcase(r.name, g) for r in sweep.runs)]:
        raise ConfigError(f"--only: {', '.join(unmatched)} match(es) no run of {sweep.name} (--dry-run lists its run "
                          "names)")
    runs = [r for r in sweep.runs if any(fnmatch.fnmatchcase(r.name, g) for g in globs)]
    return dataclasses.replace(sweep, runs=runs, only=globs)


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
        # a slice (--only) keeps what earlier invocations recorded of the runs it leaves out: one index per folder
        chosen = {r.name for r in sweep.runs}
        self.kept = [r for name, r in prior.items() if name not in chosen] if sweep.only else []

    def _record(self, run: Run, prior: dict | None) -> dict:
        rec = {"name": run.name, "point": run.point, "args": run.args, "status": "pending", "finished": None,
               "duration_s": None, "output": str(run.output), "error": None, "shape": run.shape, "exit_code": None}
        if prior and prior.get("args") == run.args:  # same run as last time: keep everything it recorded
            rec.update({k: v for k, v in prior.items() if k not in SWEEP_DEFINES})
        return rec

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
        rec.update(status=status, finished=_when(time.time()), duration_s=round(time.monotonic() - t0, 2), error=error,
                   exit_code=proc.returncode)

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
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        summary = read_summary(run.output)
        status = classify(rc, summary, False)
        error = None if status == "ok" else _error_line(summary, run.output / "train_bench.log")
        if status != "ok" and _stopped(rc, summary):
            # train_bench's own handlers were in charge while it ran (SIGTERM: callbacks/guard.py): the sweep stops
            # with the run, named by the signal it took
            self.stop_signal = self.stop_signal or (signal.SIGTERM if "SIGTERM" in (error or "") else signal.SIGINT)
            error = self.interrupted_line()
        rec.update(status=status, finished=_when(time.time()), duration_s=round(time.monotonic() - t0, 2),
                   error=error, exit_code=rc)
        if status != "ok" and CUDA_STATE_LOST.search(rec["error"] or ""):
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
