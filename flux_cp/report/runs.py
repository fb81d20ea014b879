"""Discovery and grouping: which summary.json files are usable, and which runs are compared with which.

Runs are grouped by configuration (model dims, sequence, precision, compile, SDPA backend, device,
weights, harness) and CP strategy; rows by effective world size W (simulate_world or world_size), the W=1
`--cp none` run first as the baseline. Ops runs give isolated op times, matched per W. A bare-loop run
(`--harness bare`) is its own configuration, and is held against its Lightning twin (twin_key).
"""

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from flux_cp.config import RUN_GROUPS, RunConfig, run_setting
from flux_cp.runs.results import harness, validate

OPS = ("sdpa_fwd", "sdpa_bwd", "qkv_gemm_fwd", "qkv_gemm_bwd")
COMPUTE = (*OPS, "other")
PARTS = (*COMPUTE, "comm_kv", "comm_grad", "idle")
PART_LABEL = {
    "sdpa_fwd": "SDPA fwd",
    "sdpa_bwd": "SDPA bwd",
    "qkv_gemm_fwd": "QKV GEMM fwd",
    "qkv_gemm_bwd": "QKV GEMM bwd",
    "other": "other compute",
    "comm_kv": "K/V exchange",
    "comm_grad": "gradient sync",
    "idle": "device idle (host)",
}
DTYPE_BYTES = {"bf16-true": 2, "16-true": 2, "bf16-mixed": 2, "16-mixed": 2, "32-true": 4, "64-true": 8}


BARE = " bare"  # the strategy label's mark of a bare-loop run: its rows never meet a Lightning run's


class ReportError(ValueError):
    """Bad input for the report (one line; the CLI exits 2)."""


# ---------------------------------------------------------------- discovery


@dataclass
class Run:
    path: Path
    d: dict
    # the run whose ledger prices this one's communication, where its own misses collectives (analysis.borrow_ledgers)
    ledger_twin: "Run | None" = None

    @property
    def name(self) -> str:
        return self.d.get("run_name") or self.path.parent.name

    @property
    def W(self) -> int:  # effective world size: a simulated W-way split counts as W
        return int(self.d.get("simulate_world") or self.d["world_size"])

    @property
    def harness(self) -> str:
        return harness(self.d)

    @property
    def simulated(self) -> bool:
        return bool(self.d.get("simulate_world"))

    @property
    def on_gpu(self) -> bool:
        return not str(self.d["env"]["device"]).startswith("cpu")

    @property
    def timer(self) -> str:  # what the step times are: CUDA events on GPU, perf_counter on CPU
        return "CUDA events" if self.on_gpu else "perf_counter"

    @property
    def fake_collectives(self) -> bool:  # torch's fake process group: a simulated rank of a W-rank job
        return self.d.get("collectives") == "fake" or self.simulated

    def metric(self, name: str) -> float | None:
        m = self.d["metrics"].get(name)
        return None if m is None else float(m["median"])

    def spread(self, name: str = "step_ms") -> tuple[float | None, str]:
        """The metric's spread across measured steps: IQR from per_step (4+ steps), else max - min."""
        vals = [v for v in (self.d.get("per_step") or {}).get(name) or [] if isinstance(v, (int, float))
                and math.isfinite(v)]
        if len(vals) >= 4:
            q = statistics.quantiles(vals, n=4)
            return q[2] - q[0], "IQR"
        m = self.d["metrics"].get(name)
        return (float(m["max"]) - float(m["min"]), "min-max") if m else (None, "")


@dataclass
class Skipped:
    path: Path
    status: str  # "skipped" (unusable) | "partial" (complete: false)
    reason: str


def discover(root: Path) -> tuple[list[Run], list[Skipped]]:
    """Every summary.json under root: usable runs, and the others with the reason they were left out."""
    runs, skipped = [], []
    for p in sorted(Path(root).rglob("summary.json")):
        try:
            d = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            skipped.append(Skipped(p, "skipped", f"unreadable JSON ({type(e).__name__}: {_first_line(e)})"))
            continue
        if not isinstance(d, dict):
            skipped.append(Skipped(p, "skipped", f"not a JSON object ({type(d).__name__})"))
            continue
        nan = _nan_problems(d)
        if nan.get("partial"):  # a NaN loss or step time: what was measured is not a usable step
            skipped.append(Skipped(p, "partial", nan["partial"]))
            continue
        if nan.get("metrics"):  # an all-NaN metric is reported as such (validate would call it out of order)
            d = {**d, "metrics": {k: v for k, v in d["metrics"].items() if k not in nan["metrics"]},
                 "nan_metrics": nan["metrics"]}
        try:
            errs = validate(d) or _extra_checks(d)
        except Exception as e:  # wrong types inside: still a schema mismatch, never a crash
            errs = [f"malformed ({type(e).__name__}: {_first_line(e)})"]
        if errs:
            skipped.append(Skipped(p, "skipped", "schema mismatch: " + "; ".join(errs[:3])))
        elif d.get("complete") is False:
            why = _first_line(d.get("error") or "run stopped before the end")
            skipped.append(Skipped(p, "partial", f"complete: false ({why})"))
        else:
            runs.append(Run(p, d))
    return runs, skipped


def _nan(x) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def _nan_problems(d: dict) -> dict:
    """NaN losses and NaN metrics: {"partial": reason} or {"metrics": [names whose figures are all NaN]}."""
    loss = d.get("loss") if isinstance(d.get("loss"), list) else []
    if bad := [i for i, x in enumerate(loss) if _nan(x)]:
        return {"partial": f"NaN loss at step {bad[0]} ({len(bad)} of {len(loss)} steps): diverged or broken run"}
    metrics = d.get("metrics") if isinstance(d.get("metrics"), dict) else {}
    names = sorted(k for k, m in metrics.items() if isinstance(m, dict) and _nan(m.get("median")))
    if any(k in names for k in ("step_ms", "host_ms")):
        return {"partial": f"metric(s) {', '.join(names)} all NaN: no usable step time"}
    return {"metrics": names}


def _extra_checks(d: dict) -> list[str]:
    """What the report reads beyond results.validate()."""
    errs = []
    cfg = d["config"]
    for section, keys in (("model", ("num_heads", "head_dim")), ("data", ("image_height", "image_width",
                          "text_tokens", "batch_size")), ("run", ("precision",))):
        if not isinstance(cfg.get(section), dict) or any(k not in cfg[section] for k in keys):
            errs.append(f"config.{section} lacks one of {keys}")
    if not isinstance(d["world_size"], int) or d["world_size"] < 1:
        errs.append(f"world_size {d['world_size']!r}")
    return errs


def _first_line(x) -> str:
    s = str(x).strip().splitlines()
    return s[0][:200] if s else ""


# ---------------------------------------------------------------- grouping


ACROSS = ("lora", "checkpointing", "fp8")  # settings a report compares across when asked (report.py --across)


def config_key(d: dict, across: tuple[str, ...] = ()) -> dict:
    """What must match for two runs to be compared (the CP strategy and W excluded; `across`: ACROSS settings left
    out, so that runs differing in them share a configuration and its W=1 baseline)."""
    cfg, comp = d["config"], d.get("compile") or {}
    m, data, run = cfg["model"], cfg["data"], cfg["run"]
    key = {
        "device": d["env"]["device"],
        "heads": m["num_heads"],
        "head_dim": m["head_dim"],
        "mlp_ratio": m.get("mlp_ratio"),
        "blocks": f"{m.get('double_blocks')}+{m.get('single_blocks')}",
        "seq_len": data["image_height"] * data["image_width"] + data["text_tokens"],
        "batch": data["batch_size"],
        "precision": run["precision"],
        "compile": (((comp.get("mode") or "default") + ("" if comp.get("scope", "blocks") == "blocks" else
                                                         f", {comp['scope']}")) if comp.get("enabled") else "off")
        + (" + step graph" if d.get("step_graph") else ""),  # the whole step replayed from one CUDA graph
        # the setting, not the strategy's pick: the ring and allgather-kv pin flash under auto (a workaround that is
        # part of their cost), and the user's W=1 step is plain SDPA with torch's own pick
        "sdpa_backend": run.get("sdpa_backend", "auto"),
        "timing": run.get("timing", True),
        # recorded in every step (summaries before 2026-12-04 13:00: its host time in step_ms), in instrumented
        # steps only (out of step_ms), or off: runs of different ledger placement do not pair
        "ledger": (d.get("ledger_steps") or "every step") if run.get("ledger", True) else "off",
        # FSDP adds all-gathers / reduce-scatters; ZeRO-1 and ZeRO-2 are DDP's training with a sharded optimizer
        # (the strategy label says so), identical at W=1, so their runs share DDP's baseline
        "weights": {"zero": "ddp", "zero2": "ddp"}.get(w := d.get("weights") or run.get("weights", "ddp"), w),
        # a bare loop's steps lack Lightning's hooks: neither its baseline nor its repeats mix with Lightning's
        "harness": harness(d),
        # other work a step: LoRA (frozen base, adapters), recompute, float8 GEMMs
        "lora": f"r{run['lora_rank']} {run.get('lora_targets', 'attention')}" if run.get("lora_rank") else "off",
        "checkpointing": run.get("checkpointing", "none"),
        "fp8": run.get("fp8", "none"),
    }
    return {k: v for k, v in key.items() if k not in across}


def strategy_label(d: dict) -> str:
    cp = d["cp"]
    if cp == "torch":
        cp += f"({d['config']['run'].get('rotate', 'allgather')})"
    # ZeRO: AdamW state sharded over the W ranks (zero2: gradients too); FSDP: parameters, gradients and state
    zero = {"zero": " zero", "zero2": " zero2", "fsdp": " fsdp"}.get(d.get("weights"), "")
    zero += "-buckets" if d["config"]["run"].get("zero_bucket_view") else ""  # ZeRO: one flat buffer per rank
    if run_setting(d["config"]["run"], "zero2_gather") == "forward":  # in the forward (a share of the buckets: %)
        share = run_setting(d["config"]["run"], "zero2_forward_share")
        zero += "-fwdgather" + (f"{share:.0%}" if share != 1 else "")
    if (mb := run_setting(d["config"]["run"], "zero2_bucket_mb")) != RunConfig.zero2_bucket_mb:
        zero += f"-{mb:g}MiB"  # ZeRO-2's buckets, not DDP's 25 MiB
    if d["cp"] == "ulysses" and run_setting(d["config"]["run"], "ulysses_qkv") == "separate":
        cp += " qkv-separate"  # q, k, v in an all-to-all each (every run before the setting existed)
    if run_setting(d["config"]["run"], "ulysses_overlap"):
        cp += " overlap"  # the single blocks' all-to-alls under their MLP (--ulysses-overlap)
    split = " split-cond" if d["config"]["run"].get("split_conditioning") else ""  # AdaLN linears split over W
    split += _contention_mark(d["config"]["run"])
    bare = BARE if harness(d) == "bare" else ""  # before " simulated": match_isolated reads the label's end
    return cp + zero + split + bare + (" simulated" if d.get("simulate_world") else "")


def _contention_mark(run: dict) -> str:
    """--contention: the simulated rank computed beside its collectives' traffic (its CTAs where not the default)."""
    if not run_setting(run, "contention"):
        return ""
    ctas = run_setting(run, "contention_ctas")
    return " contention" + ("" if ctas == RunConfig.contention_ctas else f"-{ctas}cta")


@dataclass
class Row:
    W: int
    run: Run
    baseline: bool = False
    a: dict = field(default_factory=dict)  # the analysis: parts, speedups, comm, amdahl, verdict


@dataclass
class Config:
    id: str
    key: dict
    strategy: str
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    profiled: dict[int, Run] = field(default_factory=dict)  # per W, the latest run with a kernel breakdown

    @property
    def baseline(self) -> Row | None:
        return next((r for r in self.rows if r.baseline), None)

    @property
    def title(self) -> str:
        k = self.key
        return (f"{self.strategy}: S={k['seq_len']}, batch {k['batch']}, {k['heads']}x{k['head_dim']} heads, "
                f"blocks {k['blocks']}, {k['precision']}, compile {k['compile']}, SDPA {k['sdpa_backend']}, "
                f"weights {self._weights()}, {k['device']}")

    def _weights(self) -> str:
        """The key's weights (zero and zero2 share DDP's) with what the strategy label adds."""
        if " zero2" in self.strategy:
            return "ZeRO-2 (gradients reduce-scattered, optimizer sharded, no DDP wrapper)"
        if self.strategy.startswith("tp"):
            return "sharded by heads and MLP features (TP), the replicated rest under DDP"
        return self.key.get("weights", "ddp") + (" + ZeRO optimizer" if " zero" in self.strategy else "")


def _latest(runs: list[Run]) -> tuple[Run, list[Run]]:
    runs = sorted(runs, key=lambda r: (r.path.stat().st_mtime, str(r.path)))
    return runs[-1], runs[:-1]


def group(runs: list[Run], across: tuple[str, ...] = ()) -> list[Config]:
    """Train configurations: one per (config key, strategy), rows by W with the W=1 baseline first."""
    buckets: dict[str, list[Run]] = {}
    for r in runs:
        if r.d["mode"] == "train":
            buckets.setdefault(json.dumps(config_key(r.d, across), sort_keys=True), []).append(r)
    all_w1 = [r for r in runs if r.d["mode"] == "train" and r.W == 1 and not r.simulated]
    configs = []
    for kjson, bucket in sorted(buckets.items()):
        key = json.loads(kjson)
        w1_none = [r for r in bucket if r.W == 1 and r.d["cp"] == "none" and not r.simulated]
        strategies = sorted({strategy_label(r.d) for r in bucket if r.d["cp"] != "none" or r.simulated})
        for strat in strategies or ["none" + (BARE if key["harness"] == "bare" else "")]:
            notes = []
            mine = [r for r in bucket if strategy_label(r.d) == strat]
            base = w1_none or [r for r in mine if r.W == 1 and not r.simulated]
            rows, profiled = [], {}
            if base:
                profiled[1] = _latest_profiled(base)
                b, dup = _latest(base)
                rows.append(Row(1, b, baseline=True))
                notes += [f"{len(dup)} other W=1 baseline run(s); using the latest, {b.name}"] if dup else []
            else:
                notes.append(_missing_baseline(key, all_w1))
            by_w: dict[int, list[Run]] = {}
            for r in mine:
                if not (base and r in base):
                    by_w.setdefault(r.W, []).append(r)
            for w, rs in sorted(by_w.items()):
                profiled[w] = _latest_profiled(rs)
                r, dup = _latest(rs)
                rows.append(Row(w, r))
                if dup:
                    notes.append(f"{len(dup)} other run(s) at W={w}; using the latest, {r.name}")
            profiled = {w: r for w, r in profiled.items() if r is not None}
            configs.append(Config(f"c{len(configs) + 1}", key, strat, rows, notes, profiled))
    return configs


def _latest_profiled(runs: list[Run]) -> Run | None:
    with_profile = [r for r in runs if (r.d.get("profile") or {}).get("breakdown_ms")]
    return _latest(with_profile)[0] if with_profile else None


def _missing_baseline(key: dict, w1: list[Run]) -> str:
    msg = "no W=1 baseline with these settings (a --cp none run at --devices 1): only absolute times"
    if w1:  # name what differs in the closest W=1 run, so the user can rerun the right one
        diffs = [(sum(config_key(r.d)[k] != v for k, v in key.items()), r) for r in w1]
        n, r = min(diffs, key=lambda x: x[0])
        what = ", ".join(f"{k} {config_key(r.d)[k]} vs {v}" for k, v in key.items() if config_key(r.d)[k] != v)
        msg += f"; closest W=1 run {r.name} differs in {what}"
    return msg


# Run settings that are bookkeeping, not the measured step: the harness's own (what its overhead is measured
# with), timing and profiling (the bare loop has none), output, and the run's length
BOOKKEEPING = frozenset((*RUN_GROUPS["Harness"], *RUN_GROUPS["Timing and profiling"], *RUN_GROUPS["Output"],
                         "steps", "warmup_steps", "timeout_s"))


def twin_key(d: dict) -> str:
    """What a bare run shares with its Lightning twin: device, model, data and every run setting but bookkeeping
    (strategy, rotation, SDPA backend, weights, precision, compile, split conditioning, simulated world, devices)."""
    cfg = d["config"]
    run = {k: v for k, v in cfg["run"].items() if k not in BOOKKEEPING}
    return json.dumps([d["mode"], d["env"]["device"], cfg["model"], cfg["data"], run], sort_keys=True)


# ---------------------------------------------------------------- isolated ops (ops runs)


def isolated_rows(runs: list[Run]) -> list[dict]:
    """One row per isolated measurement in ops runs, with what is needed to match it to a train config."""
    out = []
    for r in runs:
        if r.d["mode"] != "ops":
            continue
        key = config_key(r.d)
        rows = r.d.get("ops")
        if not isinstance(rows, list) or not rows:  # only the headline metrics: per call at the run's seq len
            rows = [{"op": op, "seq_len": key["seq_len"], "world": r.W, "cp": r.d["cp"], "method": "corrected",
                     "sdpa_backend": key["sdpa_backend"], "device_ms": r.d["metrics"][f"{op}_ms"],
                     "host_ms": r.d["metrics"].get(f"{op}_host_ms")} for op in OPS if f"{op}_ms" in r.d["metrics"]]
        for row in rows:
            try:
                out.append({"run": r.name, "device": key["device"], "heads": key["heads"],
                            "head_dim": key["head_dim"], "precision": key["precision"], "op": row["op"],
                            "seq_len": int(row["seq_len"]), "world": int(row["world"]), "cp": row.get("cp", r.d["cp"]),
                            "method": row.get("method", "corrected"), "graph": row.get("graph", False),
                            "simulated": bool(row.get("simulated", r.simulated)),
                            "sdpa_backend": row.get("sdpa_backend", key["sdpa_backend"]),
                            "device_ms": float(row["device_ms"]["median"]),
                            # the spread of the timed calls: an isolated speedup is noise unless it clears it
                            "device_range_ms": (row["device_ms"].get("min"), row["device_ms"].get("max")),
                            "calls": row["device_ms"].get("n"),
                            "host_ms": (row.get("host_ms") or {}).get("median")})
            except (KeyError, TypeError, ValueError):
                continue  # a row this report cannot read; the others still count
    return out


def match_isolated(iso: list[dict], key: dict, W: int, cp: str) -> dict[str, float]:
    """Per-call isolated device ms of each op for a configuration at W (same device, dims, seq len)."""
    return {op: row["device_ms"] for op, row in isolated_for(iso, key, W, cp).items()}


def isolated_for(iso: list[dict], key: dict, W: int, cp: str) -> dict[str, dict]:
    """The isolated row of each op that a configuration at W is compared with (same device, dims, seq len)."""
    base_cp, simulated = cp.split("(")[0].split(" ")[0], cp.endswith("simulated")
    found = {}
    for op in OPS:
        cands = [r for r in iso if r["op"] == op and r["world"] == W and r["seq_len"] == key["seq_len"]
                 and all(r[k] == key[k] for k in ("device", "heads", "head_dim", "precision"))
                 and (r["cp"] == base_cp or (W == 1 and r["cp"] in ("none", base_cp)))]
        # prefer the corrected method, eager, the same SDPA backend, simulated like the config, cp none at W=1
        cands.sort(key=lambda r: (r["method"] != "corrected", bool(r["graph"]),
                                  r["sdpa_backend"] != key["sdpa_backend"], W > 1 and r["simulated"] != simulated,
                                  r["cp"] != "none"))
        if cands:
            found[op] = cands[0]
    return found


def ratio(a, b):
    return a / b if a is not None and b else None


def noise(base: dict, a: dict) -> dict:
    """Is the step difference between the baseline and this row larger than the steps' own spread?"""
    spreads = [x["step_spread_ms"] for x in (base, a) if x["step_spread_ms"] is not None]
    spread = max(spreads) if spreads else None
    diff = abs(base["step_ms"] - a["projected_step_ms"])
    return {"spread_ms": spread, "kind": a["step_spread_kind"], "diff_ms": diff,
            "noisy": spread is not None and spread > diff}
