"""The report: reconcile train runs (op times inside the step) with ops runs (isolated op times).

    report = build(Path("runs"), link_gbps=450)      # discover summary.json files, group, analyse
    paths = write(report, Path("runs/report"))       # report.md, report.html, report.json, *.png

Per configuration (model dims, sequence, precision, compile, SDPA backend, device, CP strategy)
and effective world size W (simulate_world or world_size), against the W=1 baseline:
- measured speedups of the step and of every op region (in-step) and of isolated ops (ops runs);
- a breakdown of the step into parts: SDPA fwd/bwd and QKV GEMM fwd/bwd (event regions, less the
  K/V exchange that runs inside the SDPA region), gradient sync, device idle (host bound) and
  other compute (the rest: MLPs, norms, RoPE, optimizer);
- communication measured (profile) or, where it was not, ESTIMATED from bytes and the link rate;
- an Amdahl-style prediction from the per-part speedups of the compute parts, the residual named
  (comm, host, sync), and a plain-language verdict.
"""

import base64
import html
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from flux_cp.results import validate

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


class ReportError(ValueError):
    """Bad input for the report (one line; the CLI exits 2)."""


# ---------------------------------------------------------------- discovery


@dataclass
class Run:
    path: Path
    d: dict

    @property
    def name(self) -> str:
        return self.d.get("run_name") or self.path.parent.name

    @property
    def W(self) -> int:  # effective world size: a simulated W-way split counts as W
        return int(self.d.get("simulate_world") or self.d["world_size"])

    @property
    def simulated(self) -> bool:
        return bool(self.d.get("simulate_world"))

    def metric(self, name: str) -> float | None:
        m = self.d["metrics"].get(name)
        return None if m is None else float(m["median"])


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


def config_key(d: dict) -> dict:
    """What must match for two runs to be compared (the CP strategy and W excluded)."""
    cfg, comp = d["config"], d.get("compile") or {}
    m, data, run = cfg["model"], cfg["data"], cfg["run"]
    return {
        "device": d["env"]["device"],
        "heads": m["num_heads"],
        "head_dim": m["head_dim"],
        "mlp_ratio": m.get("mlp_ratio"),
        "blocks": f"{m.get('double_blocks')}+{m.get('single_blocks')}",
        "seq_len": data["image_height"] * data["image_width"] + data["text_tokens"],
        "batch": data["batch_size"],
        "precision": run["precision"],
        "compile": ((comp.get("mode") or "default") + ("" if comp.get("scope", "blocks") == "blocks" else
                                                        f", {comp['scope']}")) if comp.get("enabled") else "off",
        "sdpa_backend": d.get("sdpa_backend") or run.get("sdpa_backend", "auto"),
        "timing": run.get("timing", True),
        # FSDP adds all-gathers / reduce-scatters; ZeRO-1 is DDP with a sharded optimizer (the strategy label
        # says so), identical at W=1, so its runs share DDP's baseline
        "weights": {"zero": "ddp"}.get(w := d.get("weights") or run.get("weights", "ddp"), w),
    }


def strategy_label(d: dict) -> str:
    cp = d["cp"]
    if cp == "torch":
        cp += f"({d['config']['run'].get('rotate', 'allgather')})"
    zero = " zero" if d.get("weights") == "zero" else ""  # AdamW state sharded over the W ranks
    split = " split-cond" if d["config"]["run"].get("split_conditioning") else ""  # AdaLN linears split over W
    return cp + zero + split + (" simulated" if d.get("simulate_world") else "")


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
                f"weights {k.get('weights', 'ddp')}{' + ZeRO optimizer' if ' zero' in self.strategy else ''}, "
                f"{k['device']}")


def _latest(runs: list[Run]) -> tuple[Run, list[Run]]:
    runs = sorted(runs, key=lambda r: (r.path.stat().st_mtime, str(r.path)))
    return runs[-1], runs[:-1]


def group(runs: list[Run]) -> list[Config]:
    """Train configurations: one per (config key, strategy), rows by W with the W=1 baseline first."""
    buckets: dict[str, list[Run]] = {}
    for r in runs:
        if r.d["mode"] == "train":
            buckets.setdefault(json.dumps(config_key(r.d), sort_keys=True), []).append(r)
    all_w1 = [r for r in runs if r.d["mode"] == "train" and r.W == 1 and not r.simulated]
    configs = []
    for kjson, bucket in sorted(buckets.items()):
        key = json.loads(kjson)
        w1_none = [r for r in bucket if r.W == 1 and r.d["cp"] == "none" and not r.simulated]
        strategies = sorted({strategy_label(r.d) for r in bucket if r.d["cp"] != "none" or r.simulated})
        for strat in strategies or ["none"]:
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
                            "host_ms": (row.get("host_ms") or {}).get("median")})
            except (KeyError, TypeError, ValueError):
                continue  # a row this report cannot read; the others still count
    return out


def match_isolated(iso: list[dict], key: dict, W: int, cp: str) -> dict[str, float]:
    """Per-call isolated device ms of each op for a configuration at W (same device, dims, seq len)."""
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
            found[op] = cands[0]["device_ms"]
    return found


# ---------------------------------------------------------------- communication


def comm_estimate(d: dict, W: int, link_gbps: float) -> dict:
    """Bytes each rank sends per step, and their time at link_gbps (GB/s per direction), no overlap.

    gradient all-reduce (ring): params x bytes/param x 2(W-1)/W.
    K/V exchange, per block, each of fwd and bwd (B, H, S, D = batch, heads, full seq, head dim):
      allgather-kv: all-gather K and V fwd, reduce-scatter dK, dV bwd: 2 BHSD x (W-1)/W each way;
      ulysses: 4 all-to-alls (q, k, v, out) of the local (B, H, S/W, D), (W-1)/W of it leaves the rank;
      torch ring: W-1 rotations of the local K, V chunks (2 BHSD/W) fwd; bwd rotates dK, dV as well (2x).
    """
    cfg = d["config"]
    m, data = cfg["model"], cfg["data"]
    b = DTYPE_BYTES.get(cfg["run"]["precision"], 4)
    B, H, D = data["batch_size"], m["num_heads"], m["head_dim"]
    S = data["image_height"] * data["image_width"] + data["text_tokens"]
    blocks = int(m.get("double_blocks", 0)) + int(m.get("single_blocks", 0))
    params = d.get("params") if isinstance(d.get("params"), (int, float)) else None
    bhsd = B * H * S * D * b
    cp = d["cp"]
    if W <= 1 or cp == "none":
        kv_fwd = kv_bwd = 0.0
    elif cp == "allgather-kv":
        kv_fwd = kv_bwd = 2 * bhsd * (W - 1) / W
    elif cp == "ulysses":
        kv_fwd = kv_bwd = 4 * (bhsd / W) * (W - 1) / W
    else:  # torch ring
        kv_fwd = (W - 1) * 2 * bhsd / W
        kv_bwd = 2 * kv_fwd
    grad = params * b * 2 * (W - 1) / W if params and W > 1 else (0.0 if W <= 1 else None)
    to_ms = 1e3 / (link_gbps * 1e9)
    return {
        "kv_fwd_bytes": kv_fwd * blocks, "kv_bwd_bytes": kv_bwd * blocks, "grad_bytes": grad,
        "kv_fwd_ms": kv_fwd * blocks * to_ms, "kv_bwd_ms": kv_bwd * blocks * to_ms,
        "grad_ms": None if grad is None else grad * to_ms,
    }


# ---------------------------------------------------------------- analysis


def analyse_row(run: Run, W: int, link_gbps: float) -> dict:
    """Parts of the step (ms) at W, where comm and idle come from, and the raw figures."""
    d = run.d
    step = run.metric("step_ms")
    regions = {op: run.metric(f"{op}_ms") for op in OPS}
    calls = {op: run.metric(f"{op}_call_ms") for op in OPS}
    prof = d.get("profile") or {}
    bd = prof.get("breakdown_ms") or {}
    est = comm_estimate(d, W, link_gbps)
    notes = []
    # A simulated split communicates nothing, and a profile that found no comm kernels at W > 1 did not
    # classify them: both get the estimate.
    prof_comm = "comm_attention" in bd and "comm_grad" in bd and not run.simulated
    if prof_comm and W > 1 and not float(bd["comm_attention"]) + float(bd["comm_grad"]) > 0:
        prof_comm = False
        notes.append("the profile shows no communication kernels: comm estimated")
    if prof_comm:
        kv, grad, comm_src = float(bd["comm_attention"]), float(bd["comm_grad"]), "measured (profile)"
        tot = est["kv_fwd_ms"] + est["kv_bwd_ms"]
        kv_fwd = kv * (est["kv_fwd_ms"] / tot if tot else 0.5)  # the profile does not split fwd/bwd
        kv_bwd = kv - kv_fwd
    elif W == 1:
        kv_fwd = kv_bwd = grad = 0.0
        comm_src = "none at W=1"
    else:
        kv_fwd, kv_bwd, grad = est["kv_fwd_ms"], est["kv_bwd_ms"], est["grad_ms"] or 0.0
        comm_src = f"estimate ({link_gbps:g} GB/s)"
        if est["grad_ms"] is None:
            notes.append("no `params` in summary: gradient sync not estimated")
    # Idle from the measured steps' probes first; the profiled steps are extra steps, slowed on the host
    # by the profiler, so their idle fraction is the fallback.
    if isinstance(d.get("idle"), dict) and d["idle"].get("device_idle_frac") is not None:
        idle, idle_src = float(d["idle"]["device_idle_frac"]) * step, d["idle"].get("source", "events")
    elif prof.get("idle_frac") is not None:
        idle, idle_src = float(prof["idle_frac"]) * step, "profile"
    else:
        idle, idle_src = None, "not measured"
    # Real multi-rank steps contain their communication (K/V inside the SDPA region, the gradient
    # sync outside the op regions); a simulated W-way split has none, so comm is added on top.
    inside = not run.simulated
    parts = {op: regions[op] or 0.0 for op in OPS}
    if inside:
        parts["sdpa_fwd"] = max(0.0, parts["sdpa_fwd"] - kv_fwd) if regions["sdpa_fwd"] is not None else 0.0
        parts["sdpa_bwd"] = max(0.0, parts["sdpa_bwd"] - kv_bwd) if regions["sdpa_bwd"] is not None else 0.0
    rest = step - sum(r or 0.0 for r in regions.values()) - (grad if inside else 0.0) - (idle or 0.0)
    if rest < 0:
        notes.append(f"parts exceed the step by {-rest:.3g} ms (idle inside op regions, or comm overestimated)")
    parts["other"] = max(0.0, rest)
    parts |= {"comm_kv": kv_fwd + kv_bwd, "comm_grad": grad, "idle": idle or 0.0}
    total = sum(parts.values())
    step_m = d["metrics"]["step_ms"]
    spread = sum((d["metrics"].get(f"{op}_ms") or {}).get("rank_max_median", 0.0)
                 - (d["metrics"].get(f"{op}_ms") or {}).get("rank_min_median", 0.0) for op in OPS)
    return {
        "run": run.name, "path": str(run.path), "W": W, "world_size": d["world_size"], "simulated": run.simulated,
        "cp": d["cp"], "step_ms": step, "host_ms": run.metric("host_ms"),
        # the loop's period on the host (data loading and hooks between steps included): what a user's wall
        # clock sees; older summaries lack it
        "loop_ms": run.metric("loop_ms"),
        # a simulated split measures compute only: add the communication it would need
        "projected_step_ms": step + parts["comm_kv"] + parts["comm_grad"] if run.simulated else step,
        "step_rank_spread_ms": step_m.get("rank_max_median", step) - step_m.get("rank_min_median", step),
        "op_rank_spread_ms": spread,
        "regions_ms": regions, "call_ms": calls, "profile_call_ms": prof.get("ops_call_ms"),
        "parts_ms": parts, "shares": {k: v / total if total else None for k, v in parts.items()},
        "comm_source": comm_src, "comm_estimate": est, "idle_ms": idle, "idle_source": idle_src,
        "idle_frac": None if idle is None or not step else idle / step,
        "compile_s": (d.get("compile") or {}).get("compile_s"), "notes": notes,
    }


def _ratio(a, b):
    return a / b if a is not None and b else None


def analyse(config: Config, iso: list[dict], link_gbps: float) -> None:
    """Fill every row's analysis: parts, speedups vs the baseline, Amdahl prediction, verdict."""
    for row in config.rows:
        row.a = analyse_row(row.run, row.W, link_gbps)
        row.a["isolated_call_ms"] = match_isolated(iso, config.key, row.W, config.strategy)
    base = config.baseline.a if config.baseline else None
    for row in config.rows:
        a = row.a
        if base is None:
            a["verdict"] = _verdict(config, a, None)
            continue
        a["speedup"] = {"step": _ratio(base["step_ms"], a["step_ms"]),
                        "projected_step": _ratio(base["step_ms"], a["projected_step_ms"]),
                        # a simulated loop lacks the communication the projected step adds: no loop speedup
                        "loop": None if a["simulated"] else _ratio(base["loop_ms"], a["loop_ms"])}
        a["speedup_instep"] = {op: _ratio(base["regions_ms"][op], a["regions_ms"][op]) for op in OPS}
        a["speedup_isolated"] = {op: _ratio(base["isolated_call_ms"].get(op), a["isolated_call_ms"].get(op))
                                 for op in OPS}
        a["speedup_parts"] = {p: _ratio(base["parts_ms"][p], a["parts_ms"][p]) for p in COMPUTE}
        # Amdahl: the W=1 compute parts, each divided by its own measured speedup (= the part at W).
        compute_w = sum(base["parts_ms"][p] / s for p in COMPUTE if (s := a["speedup_parts"][p]))
        compute_w += sum(a["parts_ms"][p] for p in COMPUTE if not a["speedup_parts"][p])  # zero at W=1
        measured = a["projected_step_ms"]
        resid = measured - compute_w
        comm = a["parts_ms"]["comm_kv"] + a["parts_ms"]["comm_grad"]
        named = {"comm": comm, "host": a["parts_ms"]["idle"], "sync": max(0.0, resid - comm - a["parts_ms"]["idle"])}
        # What the isolated microbenchmarks predict: ops at their isolated speedup, the rest ideal (1/W).
        iso_pred = None
        if all(a["speedup_isolated"][op] for op in OPS):
            iso_pred = (sum(base["parts_ms"][op] / a["speedup_isolated"][op] for op in OPS)
                        + base["parts_ms"]["other"] / row.W + comm)
        a["amdahl"] = {
            "compute_ms": compute_w,
            "predicted_speedup": _ratio(base["step_ms"], compute_w),
            "measured_speedup": _ratio(base["step_ms"], measured),
            "residual_ms": resid,
            "residual": named,
            "residual_named": max(named, key=named.get) if resid > 0 and max(named.values()) > 0 else None,
            "isolated_predicted_speedup": _ratio(base["step_ms"], iso_pred),
            "ideal_speedup": row.W,
        }
        a["verdict"] = _verdict(config, a, base)


def _verdict(config: Config, a: dict, base: dict | None) -> str:
    """Plain-language reading of one row, computed from its numbers."""
    W, out = a["W"], []
    if base is None:
        out.append(f"W={W}: step {a['step_ms']:.3g} ms; no W=1 baseline, so no speedup")
    elif W == 1 and a is base:
        top = max(COMPUTE, key=lambda p: a["parts_ms"][p])
        out.append(f"baseline: {PART_LABEL[top]} is the largest part ({a['shares'][top]:.0%} of the step)")
    elif W == 1:  # the strategy at world size 1: its overhead over plain attention
        out.append(f"W=1 under cp {a['cp']}: step {1 / a['speedup']['step']:.2f}x the baseline's (CP overhead)")
    else:
        s, eff = a["speedup"]["projected_step"], a["speedup"]["projected_step"] / W
        kind = ("superlinear (check noise, caches, host effects)" if eff > 1.1 else "scales well" if eff >= 0.8
                else "scales partly" if eff >= 0.5 else "does not pay")
        sim = " (simulated, comm estimated)" if a["simulated"] else ""
        out.append(f"W={W}{sim}: {s:.2f}x step speedup ({eff:.0%} of ideal): {kind}")
        sdpa = None
        if None not in (base["regions_ms"]["sdpa_fwd"], base["regions_ms"]["sdpa_bwd"], a["regions_ms"]["sdpa_fwd"],
                        a["regions_ms"]["sdpa_bwd"]):
            sdpa = _ratio(base["regions_ms"]["sdpa_fwd"] + base["regions_ms"]["sdpa_bwd"],
                          a["regions_ms"]["sdpa_fwd"] + a["regions_ms"]["sdpa_bwd"])
        other = a["speedup_parts"]["other"]
        if sdpa is not None and other and other > sdpa * 1.2 and s > 1.1:
            out.append(f"the gain comes from the non-attention compute (other compute {other:.2f}x, "
                       f"{base['shares']['other']:.0%} of the W=1 step) more than from attention ({sdpa:.2f}x)")
        iso = a["amdahl"]["isolated_predicted_speedup"]
        if iso is not None:
            out.append(f"isolated op speedups with the rest ideal predict {iso:.2f}x")
    if a["idle_frac"] is not None and a["idle_frac"] >= 0.2:
        out.append(f"host bound at W={W}: device idle {a['idle_frac']:.0%} of the step")
    if a["loop_ms"] and a["loop_ms"] > 1.1 * a["step_ms"]:
        out.append(f"the loop is slower than the step: {a['loop_ms']:.3g} ms per iteration for a "
                   f"{a['step_ms']:.3g} ms step (host time between steps: data loading, hooks)")
    comm = a["parts_ms"]["comm_kv"] + a["parts_ms"]["comm_grad"]
    total = sum(a["parts_ms"].values())
    if W > 1 and total and comm / total >= 0.1:
        est = " (estimate)" if a["comm_source"].startswith("estimate") else ""
        out.append(f"communication {comm / total:.0%} of the step{est}: K/V exchange "
                   f"{a['parts_ms']['comm_kv']:.3g} ms, gradient sync {a['parts_ms']['comm_grad']:.3g} ms")
    if a["idle_frac"] is None and W > 1:
        out.append("device idle not recorded: host-bound time is counted as other compute")
    return "; ".join(out)


# ---------------------------------------------------------------- the report object


@dataclass
class Report:
    root: Path
    link_gbps: float
    configs: list[Config]
    runs: list[Run]
    skipped: list[Skipped]
    iso: list[dict]

    def to_dict(self) -> dict:
        return {
            "root": str(self.root), "link_gbps": self.link_gbps,
            "configurations": [{"id": c.id, "title": c.title, "key": c.key, "strategy": c.strategy, "notes": c.notes,
                                "rows": [{"baseline": r.baseline, **r.a} for r in c.rows]} for c in self.configs],
            "isolated": self.iso,
            "skipped": [{"path": str(s.path), "status": s.status, "reason": s.reason} for s in self.skipped],
        }


def build(root: Path, link_gbps: float = 450.0) -> Report:
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"RUNS_DIR {root}: not a directory (give the folder holding the runs' summary.json)")
    if not link_gbps > 0:
        raise ReportError(f"--link-gbps {link_gbps}: must be > 0 (GB/s per direction; H200 NVLink: 450)")
    runs, skipped = discover(root)
    if not runs and not skipped:
        raise ReportError(f"RUNS_DIR {root}: no summary.json found (run scripts/train_bench.py --output {root}/<name>)")
    iso = isolated_rows(runs)
    configs = []
    for c in group(runs):
        try:
            analyse(c, iso, link_gbps)
            configs.append(c)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:  # odd values: listed, never a crash
            why = f"could not analyse configuration {c.title} ({type(e).__name__}: {_first_line(e)})"
            skipped += [Skipped(r.run.path, "skipped", why) for r in c.rows]
    return Report(root, link_gbps, configs, runs, skipped, iso)


# ---------------------------------------------------------------- figures


def figures(report: Report, out: Path) -> dict[str, list[Path]]:
    """PNG figures per configuration: time breakdown per W, speedup vs W, isolated vs in-step op times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: dict[str, list[Path]] = {}
    colors = dict(zip(PARTS, plt.get_cmap("tab10").colors))
    for c in report.configs:
        paths = made.setdefault(c.id, [])
        labels = [f"W={r.W}" + (" (base)" if r.baseline else "") + (" sim" if r.a["simulated"] else "")
                  for r in c.rows]
        # 1. stacked time breakdown per W
        fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(c.rows) + 2), 3.6))
        bottom = [0.0] * len(c.rows)
        for p in PARTS:
            vals = [r.a["parts_ms"][p] for r in c.rows]
            ax.bar(labels, vals, bottom=bottom, label=PART_LABEL[p], color=colors[p])
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("ms per step")
        ax.set_title(f"{c.id}: step breakdown ({c.strategy})", fontsize=9)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
        paths.append(_save(fig, out / f"{c.id}_breakdown.png"))
        # 2. speedup vs W with the ideal line
        pts = [r for r in c.rows if "speedup" in r.a]
        if pts:
            fig, ax = plt.subplots(figsize=(5, 3.6))
            ws = [r.W for r in pts]
            ax.plot([1, max(ws)], [1, max(ws)], "k--", lw=1, label="ideal")
            ax.plot(ws, [r.a["speedup"]["projected_step"] for r in pts], "o-", lw=2, label="step (measured)")
            amd = [(r.W, r.a["amdahl"]["predicted_speedup"]) for r in pts if r.a["amdahl"]["predicted_speedup"]]
            if amd:
                ax.plot(*zip(*amd), "s:", label="Amdahl (compute parts)")
            for op in OPS:
                sp = [(r.W, r.a["speedup_instep"][op]) for r in pts if r.a["speedup_instep"][op]]
                if sp:
                    ax.plot(*zip(*sp), ".-", lw=0.8, alpha=0.7, label=f"{op} in-step")
            ax.set_xlabel("W (effective world size)")
            ax.set_ylabel("speedup vs W=1")
            ax.set_xticks(sorted(set(ws) | {1}))
            ax.set_title(f"{c.id}: speedup ({c.strategy})", fontsize=9)
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
            paths.append(_save(fig, out / f"{c.id}_speedup.png"))
        # 3. isolated vs in-step per-call op times
        fig, ax = plt.subplots(figsize=(max(5.0, 2.0 * len(c.rows) + 2), 3.6))
        n, width = len(OPS), 0.8 / 2
        for i, r in enumerate(c.rows):
            xs = [i * (n + 1) + j for j in range(n)]
            ax.bar([x - width / 2 for x in xs], [r.a["call_ms"][op] or 0 for op in OPS], width,
                   color="tab:blue", label="in-step" if i == 0 else None)
            ax.bar([x + width / 2 for x in xs], [r.a["isolated_call_ms"].get(op, 0) for op in OPS], width,
                   color="tab:orange", label="isolated" if i == 0 else None)
        ax.set_xticks([i * (n + 1) + j for i in range(len(c.rows)) for j in range(n)])
        ax.set_xticklabels([f"{op}\n{lab}" for lab in labels for op in OPS], fontsize=6, rotation=90)
        ax.set_ylabel("ms per call")
        ax.set_title(f"{c.id}: op time per call, in-step vs isolated", fontsize=9)
        ax.legend(fontsize=7)
        paths.append(_save(fig, out / f"{c.id}_ops.png"))
    return made


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


# ---------------------------------------------------------------- tables and rendering


def _f(x, nd: int = 3, suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}g}{suffix}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def tables(c: Config) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of one configuration."""
    out = []
    hdr = ["W", "run", "step ms", "speedup", "loop ms", "loop speedup", "ideal", "Amdahl (compute)",
           "isolated ops + rest/W", "residual ms", "residual is", "comm source"]
    rows = []
    for r in c.rows:
        a, am = r.a, r.a.get("amdahl", {})
        res = am.get("residual") or {}
        named = am.get("residual_named")
        rows.append([f"{r.W}" + (" (baseline)" if r.baseline else "") + (" sim" if a["simulated"] else ""), a["run"],
                     _f(a["step_ms"]), _f((a.get("speedup") or {}).get("projected_step"), 3, "x"),
                     _f(a["loop_ms"]), _f((a.get("speedup") or {}).get("loop"), 3, "x"), str(r.W),
                     _f(am.get("predicted_speedup"), 3, "x"), _f(am.get("isolated_predicted_speedup"), 3, "x"),
                     _f(am.get("residual_ms")),
                     f"{named} ({', '.join(f'{k} {v:.3g}' for k, v in res.items())} ms)" if named else "-",
                     a["comm_source"]])
    out.append(("Step time and speedup vs W=1", hdr, rows))
    hdr = ["W", *[PART_LABEL[p] for p in PARTS], "idle source"]
    rows = [[str(r.W), *[f"{_f(r.a['parts_ms'][p])} ({_pct(r.a['shares'][p])})" for p in PARTS],
             r.a["idle_source"]] for r in c.rows]
    out.append(("Step breakdown, ms per step (share of the step)", hdr, rows))
    hdr = ["W", *[f"{op} in-step" for op in OPS], *[f"{op} isolated" for op in OPS], "other compute"]
    rows = [[str(r.W), *[_f((r.a.get("speedup_instep") or {}).get(op), 3, "x") for op in OPS],
             *[_f((r.a.get("speedup_isolated") or {}).get(op), 3, "x") for op in OPS],
             _f((r.a.get("speedup_parts") or {}).get("other"), 3, "x")] for r in c.rows]
    out.append(("Op speedups vs W=1 (in-step: summed over blocks; isolated: per call, ops runs)", hdr, rows))
    hdr = ["W", *[f"{op} in-step" for op in OPS], *[f"{op} isolated" for op in OPS]]
    rows = [[str(r.W), *[_f(r.a["call_ms"][op]) for op in OPS],
             *[_f(r.a["isolated_call_ms"].get(op)) for op in OPS]] for r in c.rows]
    if any(r.a["profile_call_ms"] for r in c.rows):  # kernel time inside the regions (--profile)
        hdr += [f"{op} kernels" for op in OPS]
        for r, row in zip(c.rows, rows):
            row += [_f((r.a["profile_call_ms"] or {}).get(op)) for op in OPS]
    out.append(("Op time per call, ms", hdr, rows))
    hdr = ["W", "K/V fwd MB", "K/V bwd MB", "grad MB", "K/V ms (est)", "grad ms (est)", "used"]
    rows = []
    for r in c.rows:
        e = r.a["comm_estimate"]
        rows.append([str(r.W), _f(e["kv_fwd_bytes"] / 1e6), _f(e["kv_bwd_bytes"] / 1e6),
                     _f(None if e["grad_bytes"] is None else e["grad_bytes"] / 1e6),
                     _f(e["kv_fwd_ms"] + e["kv_bwd_ms"]), _f(e["grad_ms"]), r.a["comm_source"]])
    out.append(("Communication per step and rank: bytes and time at the link rate", hdr, rows))
    if c.profiled:  # what scales with W and what does not, by kernel class (--profile runs)
        bd = {w: r.d["profile"]["breakdown_ms"] for w, r in sorted(c.profiled.items())}
        base = bd.get(1, {})
        hdr = ["W", "run", *[f"{k} ms (x W=1)" for k in KERNEL_CLASSES]]
        rows = [[str(w), c.profiled[w].name, *[f"{_f(b.get(k))} ({_f(_ratio(b.get(k), base.get(k)), 3)})"
                                               for k in KERNEL_CLASSES]] for w, b in bd.items()]
        out.append(("Kernel time per step by class, profiler (ratio to W=1; 1/W is perfect scaling)", hdr, rows))
    return out


KERNEL_CLASSES = ("attention", "gemm", "other", "optimizer", "busy")


def _md_table(hdr, rows) -> str:
    esc = [[str(x).replace("|", "\\|") for x in row] for row in [hdr, *rows]]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(hdr)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc[1:]])


def _skipped_rows(report: Report) -> list[list[str]]:
    return [[s.status, str(s.path.relative_to(report.root)), s.reason] for s in report.skipped]


def _intro(report: Report) -> list[str]:
    n_train = sum(r.d["mode"] == "train" for r in report.runs)
    return [
        f"Runs under `{report.root}`: {n_train} train, {len(report.runs) - n_train} ops, "
        f"{len(report.skipped)} skipped or partial. Link rate for comm estimates: {report.link_gbps:g} GB/s.",
        "Parts: op regions are CUDA-event times inside the step (summed over blocks); the K/V exchange runs inside "
        "the SDPA region and is taken out of it; other compute = step - op regions - gradient sync - idle. "
        "Amdahl (compute) = W=1 compute parts each divided by its measured speedup; the residual to the measured "
        "step is named comm, host (device idle) or sync (the rest). Comm marked 'estimate' = bytes / link rate.",
    ]


def render_md(report: Report, figs: dict[str, list[Path]]) -> str:
    out = ["# flux-cp report", "", *[p + "\n" for p in _intro(report)]]
    if not report.configs:
        out.append("No complete train runs: nothing to reconcile.\n")
    for c in report.configs:
        out += [f"## {c.id}: {c.title}", ""]
        out += [f"- {n}" for n in c.notes] + ([""] if c.notes else [])
        out += ["**Verdict**", ""] + [f"- {r.a['verdict']}" for r in c.rows] + [""]
        for title, hdr, rows in tables(c):
            out += [f"### {title}", "", _md_table(hdr, rows), ""]
        out += [f"![{p.stem}]({p.name})" for p in figs.get(c.id, [])] + [""]
    if report.iso:
        keys = ("run", "op", "seq_len", "world", "cp", "method", "sdpa_backend", "device_ms", "host_ms")
        rows = [[_f(r[k]) if isinstance(r[k], float) else str(r[k]) for k in keys] for r in report.iso]
        out += ["## Isolated op times (ops runs)", "", _md_table(list(keys), rows), ""]
    if report.skipped:
        out += ["## Skipped and partial runs", "", _md_table(["status", "path", "reason"], _skipped_rows(report)), ""]
    return "\n".join(out)


def _html_table(hdr, rows) -> str:
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in hdr)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def render_html(report: Report, figs: dict[str, list[Path]]) -> str:
    """One self-contained file: tables, and the figures embedded as base64 PNGs."""
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>flux-cp report</title><style>",
           "body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}table{border-collapse:collapse;"
           "font-size:12px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
           "td:nth-child(2){text-align:left}img{max-width:100%;margin:.5em}</style></head><body>",
           "<h1>flux-cp report</h1>", *[f"<p>{e(p)}</p>" for p in _intro(report)]]
    if not report.configs:
        out.append("<p>No complete train runs: nothing to reconcile.</p>")
    for c in report.configs:
        out.append(f"<h2 id='{c.id}'>{e(c.id)}: {e(c.title)}</h2>")
        out += ["<ul>" + "".join(f"<li>{e(n)}</li>" for n in c.notes) + "</ul>"] if c.notes else []
        out.append("<p><b>Verdict</b></p><ul>" + "".join(f"<li>{e(r.a['verdict'])}</li>" for r in c.rows) + "</ul>")
        for title, hdr, rows in tables(c):
            out += [f"<h3>{e(title)}</h3>", _html_table(hdr, rows)]
        for p in figs.get(c.id, []):
            b64 = base64.b64encode(p.read_bytes()).decode()
            out.append(f"<img alt='{e(p.stem)}' src='data:image/png;base64,{b64}'>")
    if report.iso:
        keys = ("run", "op", "seq_len", "world", "cp", "method", "sdpa_backend", "device_ms", "host_ms")
        rows = [[_f(r[k]) if isinstance(r[k], float) else str(r[k]) for k in keys] for r in report.iso]
        out += ["<h2>Isolated op times (ops runs)</h2>", _html_table(keys, rows)]
    if report.skipped:
        out += ["<h2>Skipped and partial runs</h2>", _html_table(["status", "path", "reason"], _skipped_rows(report))]
    out.append("</body></html>")
    return "\n".join(out)


def write(report: Report, out: Path) -> dict:
    """report.md, report.html, report.json and the PNGs in out; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figs = figures(report, out)
    paths = {"md": out / "report.md", "html": out / "report.html", "json": out / "report.json"}
    paths["md"].write_text(render_md(report, figs))
    paths["html"].write_text(render_html(report, figs))
    paths["json"].write_text(json.dumps(report.to_dict(), indent=1, default=str))
    paths["png"] = [p for ps in figs.values() for p in ps]
    return paths


# ---------------------------------------------------------------- wandb


def wandb_group(report: Report) -> str:
    groups = [r.d.get("group", "adhoc") for r in report.runs]
    return statistics.mode(groups) if groups else "adhoc"


def log_wandb(report: Report, paths: dict, out: Path, mode: str) -> Path | None:
    """A `report` run in the runs' group (job_type report): tables and figures. Returns its run dir."""
    import wandb

    run = wandb.init(project="flux-cp", group=wandb_group(report), job_type="report", name="report",
                     dir=str(out), mode=mode, config={"link_gbps": report.link_gbps, "root": str(report.root)})
    try:
        for c in report.configs:
            for title, hdr, rows in tables(c):
                slug = title.split(",")[0].split("(")[0].strip().lower().replace(" ", "_").replace("/", "")
                run.log({f"{c.id}/{slug}": wandb.Table(columns=list(hdr), data=rows)})
        for p in paths["png"]:
            run.log({f"figures/{p.stem}": wandb.Image(str(p))})
        if report.skipped:
            run.log({"skipped": wandb.Table(columns=["status", "path", "reason"], data=_skipped_rows(report))})
        run_dir = Path(run.dir).parent if getattr(run, "dir", None) and mode != "disabled" else None
    finally:
        run.finish()
    return run_dir


def wandb_report(report: Report, mode: str, run_dir: Path | None) -> str:
    """A wandb Report (wandb-workspaces) when online; otherwise one line on how to get there."""
    if mode != "online":
        where = run_dir or "<out>/wandb/offline-run-*"
        return (f"wandb offline: sync with `wandb sync {where}` (and the train runs' wandb folders), then rerun "
                f"with --wandb-mode online --wandb-report to build the wandb Report")
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError:
        return "wandb Report skipped: wandb-workspaces is not installed (pip install wandb-workspaces)"
    import wandb

    entity = os.environ.get("WANDB_ENTITY") or wandb.Api().default_entity
    grp = wandb_group(report)
    runset = wr.Runset(entity=entity, project="flux-cp", name=grp, filters=f"Metric('group') == '{grp}'")
    rep = wr.Report(entity=entity, project="flux-cp", title=f"flux-cp: {grp}",
                    description="Does context parallelism pay? Step and op timings vs world size.")
    rep.blocks = [
        wr.H1(text=f"flux-cp report: group {grp}"),
        wr.P(text=" ".join(_intro(report))),
        *[wr.P(text=f"{c.id} {c.title}: " + " | ".join(r.a["verdict"] for r in c.rows)) for c in report.configs],
        wr.PanelGrid(runsets=[runset], panels=[
            wr.LinePlot(x="Step", y=["step_ms"]),
            wr.LinePlot(x="Step", y=[f"{op}_ms" for op in OPS]),
            wr.BarPlot(metrics=["step_ms/median"]),
        ]),
    ]
    rep.save()
    return f"wandb Report: {rep.url}"
