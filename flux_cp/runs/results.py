"""summary.json: the results contract (docs/design.md) that scripts and the report rely on.

Written atomically (temp file + rename) so that a crash never leaves half a file, and rewritten
as steps complete, so that a run that fails midway keeps what it measured (`complete: false`).
"""

import contextlib
import json
import os
import platform
import socket
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from flux_cp.runs.throughput import ranked_throughput, throughput_of

SCHEMA = 1
REQUIRED = ("schema", "mode", "run_name", "group", "world_size", "cp", "config", "env", "metrics", "loss")
TRAIN_METRICS = ("step_ms", "host_ms", "sdpa_fwd_ms", "sdpa_bwd_ms", "qkv_gemm_fwd_ms", "qkv_gemm_bwd_ms")
OPS_METRICS = ("sdpa_fwd_ms", "sdpa_bwd_ms", "qkv_gemm_fwd_ms", "qkv_gemm_bwd_ms")  # + <op>_host_ms
OPS_ROW = ("op", "seq_len", "world", "simulated", "cp", "method", "graph", "sdpa_backend", "shape", "device_ms",
           "host_ms", "flops", "tflops")  # fmt: skip


def harness(d: dict) -> str:
    """The loop a run was timed in: "lightning" or "bare" (summaries older than --harness: lightning)."""
    return d.get("harness") or "lightning"


def env_info(device=None) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def pkg(name):  # the installed version, without importing it (Lightning's import is seconds of a bare run)
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    if device is not None and getattr(device, "type", device) == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return {
        "torch": torch.__version__,
        "lightning": pkg("lightning"),
        "diffusers": pkg("diffusers"),
        "cuda": torch.version.cuda,
        # cuDNN's attention has faulted under LoRA (2026-12-07c, g) and its fixes ship by cuDNN release: say which ran
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "torchao": pkg("torchao"),  # --fp8's float8 training
        "python": platform.python_version(),
        "device": name,
        "hostname": socket.gethostname(),
        "cpu": cpu_model(),
        **_host_before(),
    }


def _host_before() -> dict:
    probe = host_probe()
    return {"host_op_us": probe["median_us"], "host_probe": probe}


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


def host_probe(n: int = 4000, reps: int = 7) -> dict:
    """The host's speed at issuing work, as the step's host-bound part sees it: microseconds per tiny torch op (a
    one-element in-place add on the CPU: Python and ATen's dispatch, no kernel worth the name), over reps of n ops:
    median, min and max, and the mean over all reps: the host speed over the whole probe (tens of ms), which a share
    of a core sets (--host-slowdown 1.25 and 1.5 read 1.26x and 1.50x the unloaded mean on a 2-core EPYC VM, their
    medians over reps of a few ms 1.56x both: the scheduler's slices are that long). On the H200 machines lent here
    the same W >= 2 step took 39 ms in one call and 78 ms in another, device time equal; one lease's probes read
    3.0-7.6 us."""
    import torch

    x = torch.zeros(1)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        times.append((time.perf_counter() - t0) / n * 1e6)
    return {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times),
            "mean_us": statistics.fmean(times), "reps": reps}


def host_op_us(n: int = 4000, reps: int = 7) -> float:
    """host_probe's median, microseconds per tiny op."""
    return host_probe(n, reps)["median_us"]


def record_host_speed(header: dict) -> None:
    """After the steps: the host probed again beside the probe before them (env), in the summary's header."""
    header["host_speed"] = host_speed(header["env"].get("host_probe"), host_probe())
    header["host_op_us_end"] = header["host_speed"]["after"]["median_us"]  # as older summaries have it


def host_speed(before: dict | None, after: dict) -> dict:
    """The probes before and after the steps, and whether the host's speed moved between them (medians more than
    10% apart, beyond either probe's spread): a host-bound step measured across the move is not one host's."""
    out = {"before": before, "after": after, "changed": None}
    if before:
        lo, hi = sorted((before["median_us"], after["median_us"]))
        spread = max(before["max_us"] - before["min_us"], after["max_us"] - after["min_us"])
        out["changed"] = hi - lo > max(0.1 * lo, spread)
    return out


def reset_peak_memory(cuda: bool) -> None:
    """Start this run's peak where its memory is now (an in-process sweep's earlier run left its own peak)."""
    if cuda:
        import torch

        torch.cuda.reset_peak_memory_stats()


def peak_memory(cuda: bool, cpu_live_bytes: int = 0) -> dict:
    """This rank's peak memory since reset_peak_memory, in GiB: the CUDA caching allocator's allocated and reserved
    bytes; on CPU the process's peak resident set (Linux: ru_maxrss in KiB; the whole process, imports included) and,
    where counted (flux_cp/measure/live_memory.py: the first warm-up steps of an eager run), the peak of its live
    tensors' bytes as allocated_gib, what the planner estimates and CUDA's allocator reports."""
    if cuda:
        import torch

        return {"allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
                "reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3)}
    import resource

    live = {"allocated_gib": round(cpu_live_bytes / 2**30, 6), "allocated_from": "live tensors, first warm-up steps"}
    return {"host_max_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
            **(live if cpu_live_bytes else {})}


_RUN_STARTED: float | None = None  # set by an in-process sweep before each run (flux_cp/runs/sweep.py)


def mark_run_start() -> None:
    """The next run in this process starts now: its start-up is its own set-up, not the process's imports."""
    global _RUN_STARTED
    _RUN_STARTED = time.time()


def run_start_time() -> float:
    """When this run started (epoch seconds): the process's start (interpreter, imports, set-up), or the time an
    in-process sweep marked."""
    if _RUN_STARTED is not None:
        return _RUN_STARTED
    import psutil

    return psutil.Process().create_time()


def wall_split(t0: float, start: float, warm: float, end: float, done: float) -> dict:
    """summary.json's wall_s: start-up (process start -> first step), warm-up, measured steps, teardown (last step
    -> the final summary), from epoch-second stamps."""
    parts = {"startup": start - t0, "warmup": warm - start, "measured": end - warm, "teardown": done - end}
    return {k: round(v, 3) for k, v in parts.items()} | {"total": round(done - t0, 3)}


def pooled_overhead(lit: list[float], bare: list[float], resamples: int = 2000) -> tuple[float, list[float]]:
    """Lightning's step median over the bare loop's, in %, with every measured step of a group's runs pooled per
    harness, and its 95% bootstrap interval (both sides resampled; a fixed seed: the report is reproducible)."""
    import random

    rng = random.Random(0)
    med = statistics.median
    est = 100 * (med(lit) / med(bare) - 1)
    boot = sorted(100 * (med(rng.choices(lit, k=len(lit))) / med(rng.choices(bare, k=len(bare))) - 1)
                  for _ in range(resamples))
    return est, [boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]]


def pooled_runs_overhead(runs: list[tuple[list[float], list[float]]], resamples: int = 2000
                         ) -> tuple[float, list[float]]:
    """Lightning's overhead over its interleaved twin pooled over runs (other data seeds): the mean of the runs'
    own overheads (each against the twin that shared its host within seconds, so a host that drifts between runs
    moves both sides), in %, and its 95% bootstrap interval, runs and each run's steps resampled (a fixed seed)."""
    import random

    rng = random.Random(0)
    med = statistics.median

    def one(lit, bare, draw=None):
        if draw:
            lit, bare = draw(lit, k=len(lit)), draw(bare, k=len(bare))
        return 100 * (med(lit) / med(bare) - 1)

    est = statistics.fmean(one(lit, bare) for lit, bare in runs)
    boot = sorted(statistics.fmean(one(*rng.choice(runs), rng.choices) for _ in runs) for _ in range(resamples))
    return est, [boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]]


def steadiness(values: list[float], rel_gap: float = 0.1) -> dict:
    """How far a step-time median can be trusted: its 95% confidence interval (order statistics), the interquartile
    spread, drift (second half's median against the first's: a warm-up too short) and whether the steps fall into
    two modes (a gap wider than rel_gap x median between two groups of >= 20% of the steps each: then one median
    describes neither, and both modes are given)."""
    import math

    s, n = sorted(values), len(values)
    med = statistics.median(s)
    k = max(0, math.floor(n / 2 - 0.98 * math.sqrt(n)))  # rank of the CI's lower end: n/2 - 1.96 sqrt(n)/2
    q = statistics.quantiles(s, n=4) if n >= 2 else [s[0]] * 3
    half = n // 2
    drift = 100 * (statistics.median(values[half:]) / statistics.median(values[:half]) - 1) if half else 0.0
    out = {"n": n, "median": med, "ci95": [s[k], s[n - 1 - k]], "iqr_pct": 100 * (q[2] - q[0]) / med,
           "drift_pct": drift}
    side = max(2, math.ceil(0.2 * n))
    gaps = [(s[i] - s[i - 1], i) for i in range(side, n - side + 1)]
    gap, i = max(gaps, default=(0.0, 0))
    modes = None
    if gap > rel_gap * med:
        modes = [{"median": statistics.median(part), "n": len(part)} for part in (s[:i], s[i:])]
    out["modes"] = modes
    problems = (["bimodal"] if modes else []) + (["drift"] if abs(out["drift_pct"]) > 5 else []) + (
        ["wide"] if (out["ci95"][1] - out["ci95"][0]) > 0.05 * med else [])
    return out | {"steady": not problems, "problems": problems}


def gather_row(row: list[float], group=None):
    """Every rank's row of figures, (W, len) in rank order, over a CPU (gloo) group; (1, len) without one."""
    import torch
    import torch.distributed as dist

    vec = torch.tensor(row, dtype=torch.float64)
    if group is None:
        return vec[None]
    out = [torch.empty_like(vec) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, vec, group=group)
    return torch.stack(out)


def stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def flat_stats(name: str, m: dict) -> dict:
    """stats() as wandb's summary holds a metric: the median under its own name, min, max and n beside it."""
    return {name: m["median"], f"{name}/min": m["min"], f"{name}/max": m["max"], f"{name}/n": m["n"]}


class RunSummary:
    """Accumulates per-step figures; `write()` renders the contract's JSON."""

    def __init__(self, path: Path, header: dict, warmup_steps: int):
        self.path = Path(path)
        self.header = header  # mode, run_name, group, world_size, cp, config, env, ...
        self.warmup_steps = warmup_steps
        self.loss: list[float] = []
        self.per_step: dict[str, list[float]] = {}  # rank 0's figure per measured step
        self.rank_max: dict[str, list[float]] = {}
        self.rank_min: dict[str, list[float]] = {}
        self.ledger: list[dict] = []  # measured steps' collectives (flux_cp/measure/ledger.py), this rank's
        self.final: dict | None = None  # the complete run's summary.json, once written (its throughput, ranked)

    def add_comm(self, step: int, kind: str, step_ms: float, comm: dict):
        if step >= self.warmup_steps:
            self.ledger.append({"step": step, "kind": kind, "step_ms": step_ms, **comm})

    def add_step(self, step: int, loss: float, metrics: dict, rank_max: dict, rank_min: dict):
        self.loss.append(loss)
        if step < self.warmup_steps:
            return
        for name, v in metrics.items():
            self.per_step.setdefault(name, []).append(v)
            self.rank_max.setdefault(name, []).append(rank_max[name])
            self.rank_min.setdefault(name, []).append(rank_min[name])

    def metrics(self) -> dict:
        out = {}
        for name, vals in self.per_step.items():
            out[name] = stats(vals)
            if self.header.get("world_size", 1) > 1:  # spread over ranks, per step, then its median
                out[name]["rank_max_median"] = statistics.median(self.rank_max[name])
                out[name]["rank_min_median"] = statistics.median(self.rank_min[name])
        return out

    def derived(self) -> dict:
        """Figures computed from the medians: device idle fraction, instrumentation overhead, compile time."""
        med = {k: statistics.median(v) for k, v in self.per_step.items()}
        out = {}
        if "device_busy_ms" in med and "step_ms" in med:  # probe steps: the device's time with the host ahead
            out["device_idle_frac"] = max(0.0, 1.0 - med["device_busy_ms"] / med["step_ms"])
        if "device_busy_ms" in med and "loop_ms" in med:  # the same over the loop's period: gaps between steps too
            out["loop_idle_frac"] = max(0.0, 1.0 - med["device_busy_ms"] / med["loop_ms"])
        if "step_timed_ms" in med and "step_ms" in med:  # steps with op regions against those without, one run
            out["timing_overhead_pct"] = 100.0 * (med["step_timed_ms"] / med["step_ms"] - 1.0)
        elif "step_untimed_ms" in med and "step_ms" in med:  # summaries before --regions-every (--timing-ab)
            out["timing_overhead_pct"] = 100.0 * (med["step_ms"] / med["step_untimed_ms"] - 1.0)
        if "warmup_s" in self.header and "step_ms" in med:  # warm-up wall time beyond as many steady steps
            steady_s = self.header["warmup_steps"] * max(med["step_ms"], med.get("host_ms", 0.0)) / 1e3
            out["compile_s"] = max(0.0, self.header["warmup_s"] - steady_s)
        return out

    def to_dict(self, complete: bool, error: str | None = None) -> dict:
        # a simulated rank's values went through collectives that moved nothing: its losses mean nothing
        loss = None if self.header.get("collectives") == "fake" else self.loss
        d = {"schema": SCHEMA, **self.header, "metrics": self.metrics(), "loss": loss, "complete": complete}
        if loss is None:  # the rank's own values, for A/B checks of one configuration (e.g. --contention on and off)
            d["rank_loss"] = self.loss
        derived = self.derived()
        if "device_idle_frac" in derived:
            d["idle"] = {"device_idle_frac": derived["device_idle_frac"], "source": "events"}
            if "loop_idle_frac" in derived:
                d["idle"]["loop_idle_frac"] = derived["loop_idle_frac"]
        if "timing_overhead_pct" in derived:
            d["timing_overhead_pct"] = derived["timing_overhead_pct"]
        if "profile" in d and d["profile"].get("fidelity"):
            # The profiler slows the host, opening gaps inside the regions of profiled steps; kernel durations
            # are not affected. So kernel time per call is also held against the unprofiled steps' regions.
            fid = {op: dict(f) for op, f in d["profile"]["fidelity"].items()}
            for op, f in fid.items():
                vals = self.per_step.get(f"{op}_call_ms")
                if vals:
                    f["events_measured_ms"] = statistics.median(vals)
                    f["diff_measured_pct"] = 100 * (f["events_measured_ms"] / f["kernels_ms"] - 1)
            d["profile"] = {**d["profile"], "fidelity": fid}
        if len(self.per_step.get("step_ms", [])) >= 2:
            d["steadiness"] = steadiness(self.per_step["step_ms"])
        if "config" in d:
            d["throughput"] = throughput_of(d)
        if "compile" in d and "compile_s" in derived and d["compile"].get("enabled"):
            d["compile"] = {**d["compile"], "compile_s": derived["compile_s"]}
        d["per_step"] = self.per_step
        if error:
            d["error"] = error
        if errors := read_errors(self.path.parent):  # any rank's failure: the first one is the run's error
            errors = [{k: v for k, v in e.items() if k != "traceback"} for e in errors]  # those stay in error-rank*
            d |= {"complete": False, "errors": errors, "error": errors[0]["error"]}
            d |= {k: errors[0][k] for k in ("error_kind", "error_rank", "shape")}
        if (complete or "error" in d) and "config" in d and "metrics" in d:  # the final write (flushes are host time)
            d["ranked"] = ranked_throughput(d, self.ledger)
        if self.ledger:
            from flux_cp.measure.ledger import totals

            # a typical step's: the totals most steps share (a one-off, e.g. Lightning's object broadcast in the first
            # measured step, stays in the ledger only)
            per = [json.dumps(totals(s["collectives"]), sort_keys=True) for s in self.ledger]
            counts = Counter(per)  # ties: the latest step's
            d["comm"] = {"per_step": json.loads(max(reversed(per), key=counts.__getitem__))}
            # every step's collectives (hundreds of KB under ZeRO) in the final write, or a failed run's: the
            # flushes while measuring are host time between steps
            if complete or "error" in d:
                d["comm"]["ledger"] = self.ledger
        return d

    def record_error(self, rank: int, error: str, kind: str, shape: dict, at: float | None = None,
                     trace: str | None = None) -> Path:
        """Rank's own error file (no other rank writes it; with the whole traceback), then summary.json with every
        error so far (one line each)."""
        entry = {"error_rank": rank, "error": error, "error_kind": kind, "shape": shape, "time": at or time.time()}
        write_json_atomic(self.path.parent / f"{ERROR_FILE_PREFIX}{rank}.json", entry | {"traceback": trace})
        return self.write(complete=False)

    def write(self, complete: bool, error: str | None = None) -> Path:
        d = self.to_dict(complete, error)
        if complete:
            self.final = d
        return write_json_atomic(self.path, d)


ERROR_FILE_PREFIX = "error-rank"  # <output>/error-rank<r>.json: one per failed rank, merged into summary.json


def read_errors(out_dir: Path) -> list[dict]:
    """Every rank's error of this run, first (by time) first."""
    errors = []
    for f in Path(out_dir).glob(f"{ERROR_FILE_PREFIX}*.json"):
        try:
            errors.append(json.loads(f.read_text()))
        except (OSError, ValueError):  # removed meanwhile; atomic writes never leave half a file
            continue
    return sorted(errors, key=lambda e: e["time"])


def write_json_atomic(path: Path, data: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # disk full, a value JSON cannot hold, Ctrl-C: no temp file left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def validate(d: dict) -> list[str]:
    """Problems with a summary dict against the contract (empty when valid)."""
    errs = [f"missing key {k!r}" for k in REQUIRED if k not in d]
    if errs:
        return errs
    if d["schema"] != SCHEMA:
        errs.append(f"schema {d['schema']} != {SCHEMA}")
    if d["mode"] not in ("train", "ops"):
        errs.append(f"mode {d['mode']!r}")
    for k in ("torch", "lightning", "diffusers", "device", "hostname"):
        if k not in d["env"]:
            errs.append(f"env lacks {k!r}")
    for name, m in d["metrics"].items():
        if not name.endswith("_ms"):
            errs.append(f"metric {name!r} does not end in _ms")
        for k in ("median", "min", "max", "n"):
            if k not in m:
                errs.append(f"metric {name!r} lacks {k!r}")
        if not m.get("min", 0) <= m.get("median", 0) <= m.get("max", 0):
            errs.append(f"metric {name!r}: min <= median <= max violated")
    if d["mode"] == "train":
        errs += [f"train metric {k!r} missing" for k in ("step_ms", "host_ms") if k not in d["metrics"]]
        if d.get("collectives") == "fake":
            if d["loss"] is not None:
                errs.append("loss of a run over fake collectives must be null (its values are not meaningful)")
        elif not isinstance(d["loss"], list) or not all(isinstance(x, float) for x in d["loss"]):
            errs.append("loss must be a list of floats")
    if d["mode"] == "ops":
        errs += _validate_ops(d)
    return errs


def _validate_ops(d: dict) -> list[str]:
    errs = [f"ops key {k!r} missing" for k in ("ops", "peak_tflops", "simulate_world") if k not in d]
    if d.get("complete"):
        errs += [f"ops metric {k!r} missing" for k in OPS_METRICS if k not in d["metrics"]]
        errs += [f"ops metric {k[:-3]}_host_ms missing" for k in OPS_METRICS if f"{k[:-3]}_host_ms" not in d["metrics"]]
    for i, row in enumerate(d.get("ops", [])):
        errs += [f"ops[{i}] lacks {k!r}" for k in OPS_ROW if k not in row]
        if errs:
            break
        if row["op"] not in (*(k[:-3] for k in OPS_METRICS), "gemm_peak"):
            errs.append(f"ops[{i}]: op {row['op']!r}")
        if row["method"] not in ("corrected", "seed-compat"):
            errs.append(f"ops[{i}]: method {row['method']!r}")
        for key in ("device_ms", "host_ms"):
            m = row[key]
            if m is None and key == "host_ms":
                continue
            if not all(k in m for k in ("median", "min", "max", "n")) or not 0 < m["min"] <= m["median"] <= m["max"]:
                errs.append(f"ops[{i}].{key}: need 0 < min <= median <= max and n")
        if not (row["flops"] > 0 and 0 < row["tflops"] < float("inf")):
            errs.append(f"ops[{i}]: flops and tflops must be positive and finite")
    return errs
