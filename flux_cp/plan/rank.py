"""The plans of a cell, measured and ranked: each ran as rank 0 of its W-rank job over torch's fake process group
(its compute measured, its collectives recorded by the ledger), its collectives priced with a link profile and
placed on its step (report.analysis.comm_prediction: the report's own pricing), ranked by the time a global batch
takes; throughput and MFU at that predicted step. Each ranked row carries its measured steps (`steps`) and the 95%
confidence interval of its step (`step_ms_ci95`: the rank's measured interval, summary.json `steadiness`, moved by
the priced communication, which adds no noise of its own); neighbours in the ranking whose intervals overlap are
`tied_with` each other (within each other's noise: the order between them is not measured).

    rows = rank(plans, runs_dir, link)      # fastest first; plain data parallelism (cp_degree 1) marked
"""

import json
import math
import os
import shlex
from pathlib import Path

from flux_cp.plan.plans import Plan
from flux_cp.report.analysis import borrow_ledgers, comm_prediction, peak_gib
from flux_cp.report.runs import Run
from flux_cp.runs.results import steadiness
from flux_cp.runs.sweep_config import _flag
from flux_cp.runs.throughput import throughput_of


def command(plan: Plan, config_file: str | None) -> str:
    """The train_bench command that runs the plan on W real GPUs (torchrun or Lightning's launcher)."""
    args = ["python", "scripts/train_bench.py"] + (["--config", config_file] if config_file else [])
    args += ["--devices", str(plan.world)]
    for k, v in plan.settings.items():
        if v is not None and k != "simulate_world":
            args += _flag(k, v)
    return shlex.join(args)


def rank(plans: list[Plan], runs_dir: Path, link, memory_gib_limit: float | None = None,
         config_file: str | None = None) -> list[dict]:
    """One row per plan that ran (ranked by time per global batch), then the pruned, failed and over-memory ones
    (unranked). Paths in the rows are relative to runs_dir (where plan.json goes)."""
    runs, by_name = [], {}
    for p in plans:
        f = Path(runs_dir) / p.name / "summary.json"
        if p.pruned is None and f.is_file():
            d = json.loads(f.read_text())
            if d.get("complete") and (d.get("metrics") or {}).get("step_ms"):
                by_name[p.name] = Run(f, d)
                runs.append(by_name[p.name])
    borrow_ledgers(runs)  # a step-graph run whose ledger is not placed (older runs): as its eager twin's, if it ran
    rows = []
    for p in plans:
        row = {"plan": p.name, "dp": p.dp, "cp_degree": p.cp_degree, "cp": p.cp, "weights": p.weights,
               "build": p.build, "W": p.world, "baseline": p.baseline, "estimated_gib": p.memory_gib,
               "micro_batches": p.accumulate,
               "command": command(p, config_file)}
        if p.pruned is not None:
            rows.append(row | {"status": "pruned", "why": p.pruned})
            continue
        run = by_name.get(p.name)
        if run is None:
            rows.append(row | {"status": "failed", "why": _failure(Path(runs_dir) / p.name)})
            continue
        pred = comm_prediction(run, p.world, link) if p.world > 1 else {"predicted_ms": run.metric("step_ms"),
                                                                         "exposed_ms": 0.0, "source": "none at W=1"}
        t = throughput_of(run.d, step_ms=pred["predicted_ms"])
        peak = peak_gib(run.d)
        fits = memory_gib_limit is None or peak is None or peak <= memory_gib_limit
        n, ci = confidence(run.d)
        shift = pred["predicted_ms"] - run.metric("step_ms")  # the priced communication: no noise of its own
        rows.append(row | {
            "status": "ran" if fits else "over memory",
            **({} if fits else {"why": f"measured peak {peak:.3g} GiB > {memory_gib_limit:.3g} GiB a GPU"}),
            "rank_step_ms": run.metric("step_ms"), "step_ms": pred["predicted_ms"], "steps": n,
            "step_ms_ci95": None if ci is None else [min(ci[0] + shift, pred["predicted_ms"]),
                                                     max(ci[1] + shift, pred["predicted_ms"])],
            "rank_step_ms_ci95": ci,
            "exposed_comm_ms": pred.get("exposed_ms"), "comm_source": pred["source"],
            "tokens_per_s_per_gpu": t.get("throughput/device/items_per_sec"),
            "samples_per_s": t.get("throughput/samples_per_sec"),
            "tflops_per_gpu": (t.get("throughput/device/flops_per_sec") or 0) / 1e12 or None,
            "mfu": t.get("throughput/device/mfu"), "peak_gib": peak,
            "run": os.path.relpath(run.path.parent, runs_dir),
            "basis": "simulated rank, collectives priced" if p.world > 1 else "measured",
        })
    ran = sorted((r for r in rows if r["status"] == "ran"), key=lambda r: r["step_ms"])
    for i, r in enumerate(ran, 1):
        r["rank"] = i
    mark_ties(ran)
    return ran + [r for r in rows if r["status"] != "ran"]


def mark_ties(ranked: list[dict]) -> None:
    """Each ranked row's `tied_with`: the neighbours in the ranking whose 95% intervals of the step overlap its own."""
    for r in ranked:
        r["tied_with"] = []
    for a, b in zip(ranked, ranked[1:]):
        if overlap(a["step_ms_ci95"], b["step_ms_ci95"]):
            a["tied_with"].append(b["plan"])
            b["tied_with"].append(a["plan"])


def confidence(d: dict) -> tuple[int, list[float] | None]:
    """A run's measured (plain) steps and the 95% confidence interval of their median step time: summary.json's
    `steadiness`, else computed from its per-step times; (n, None) under 2 steps."""
    st = d.get("steadiness")
    if st and st.get("ci95"):
        return int(st["n"]), [float(x) for x in st["ci95"]]
    vals = [v for v in (d.get("per_step") or {}).get("step_ms") or [] if isinstance(v, int | float)
            and math.isfinite(v)]
    if len(vals) < 2:
        return len(vals) or int(((d.get("metrics") or {}).get("step_ms") or {}).get("n") or 0), None
    return len(vals), steadiness(vals)["ci95"]


def overlap(a: list[float] | None, b: list[float] | None) -> bool:
    """Two intervals share a point (neither is known: no)."""
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def _failure(out: Path) -> str:
    f = out / "summary.json"
    if not f.is_file():
        return "no summary.json (not run)"
    d = json.loads(f.read_text())
    return d.get("error") or "incomplete"


def best_against_dp(rows: list[dict]) -> dict:
    """The fastest plan, the runner-up, and plain data parallelism's best beside them."""
    ran = [r for r in rows if r["status"] == "ran"]
    dp = [r for r in ran if r["baseline"]]
    return {"best": ran[0] if ran else None, "runner_up": ran[1] if len(ran) > 1 else None,
            "data_parallel": dp[0] if dp else None,
            "best_over_dp": (dp[0]["step_ms"] / ran[0]["step_ms"]) if ran and dp else None,
            "best_tied": bool(ran and ran[0]["tied_with"])}
