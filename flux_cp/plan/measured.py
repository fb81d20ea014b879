"""Plans ranked from runs already measured (scripts/plan.py --measured): a suite's simulated ranks at Flux.1's depth
cost ~30 s of a GPU each, so a cell's plans are taken from the runs whose settings are the plan's own rather than run
again. A run matches a plan when every setting but bookkeeping (harness, timing, output, the run's length) equals the
plan's as the run's checks resolve it, the model and data included; a variant the planner has no axis for (FSDP's
prefetch, --contention, ...) matches no plan.

    runs = index_runs([Path("runs/gpu_call/flux1-depth")])     # every complete summary.json under the folders
    found = match(cfg, plans, runs)          # {plan name: {"path": its run's folder, "device": ...}}
"""

import dataclasses
import json
from pathlib import Path

from flux_cp.config import BenchConfig, config_from_summary
from flux_cp.plan.plans import Plan, check_settings
from flux_cp.report.regimes import sdpa_setting
from flux_cp.report.runs import BOOKKEEPING


def settings_key(cfg: BenchConfig) -> str:
    """What makes two runs the same measurement: model, data and every run setting but bookkeeping (the ring's
    explicit flash is its auto: it pins flash)."""
    d = dataclasses.asdict(cfg)
    d["run"] = {k: v for k, v in d["run"].items() if k not in BOOKKEEPING} | {"sdpa_backend": sdpa_setting(d["run"])}
    d["data"] = {k: v for k, v in d["data"].items() if k != "global_batch"}  # batch_size (a group's) and W say it
    return json.dumps({k: v for k, v in d.items() if k in ("model", "data", "run")}, sort_keys=True)


def index_runs(roots: list[Path]) -> dict[str, dict]:
    """{settings key: {"path": folder, "device": ...}} of every complete run (a measured step) under the folders; of
    runs with the same settings, the one written last."""
    out: dict[str, dict] = {}
    for root in roots:
        for f in sorted(Path(root).rglob("summary.json")):
            try:
                d = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if not (d.get("complete") and ((d.get("metrics") or {}).get("step_ms") or {}).get("median")):
                continue
            key = settings_key(config_from_summary(d["config"]))
            ended = f.stat().st_mtime  # summary.json is written as the run ends
            if key not in out or ended >= out[key]["ended"]:
                out[key] = {"path": f.parent, "device": (d.get("env") or {}).get("device"), "ended": ended}
    return out


def match(cfg: BenchConfig, plans: list[Plan], runs: dict[str, dict]) -> dict[str, dict]:
    """{plan name: its run} for each plan left to run that a measured run matches (resolved as on a GPU, then as on
    a CPU: the accelerator is a setting like the others)."""
    out = {}
    for p in plans:
        for on_gpu in (True, False):
            why, resolved = (p.pruned, None) if p.pruned is not None else check_settings(cfg, p.settings, on_gpu=on_gpu)
            if why is None and (run := runs.get(settings_key(resolved))):
                out[p.name] = run
                break
    return out
