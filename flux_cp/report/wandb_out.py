"""The report mirrored to wandb: a `report` run in the runs' group, and a wandb Report when online."""

import os
import statistics
from pathlib import Path

from flux_cp.predict.links import name_of

from .analysis import Report
from .render import _intro, _skipped_rows, harness_table, regimes_table, tables
from .runs import OPS


def wandb_group(report: Report) -> str:
    groups = [r.d.get("group", "adhoc") for r in report.runs]
    return statistics.mode(groups) if groups else "adhoc"


def log_wandb(report: Report, paths: dict, out: Path, mode: str) -> Path | None:
    """A `report` run in the runs' group (job_type report): tables and figures. Returns its run dir."""
    import wandb

    run = wandb.init(project="flux-cp", group=wandb_group(report), job_type="report", name="report",
                     dir=str(out), mode=mode, config={"link": name_of(report.link), "root": str(report.root)})
    try:
        for c in report.configs:
            for title, hdr, rows in tables(c):
                slug = title.split(",")[0].split("(")[0].strip().lower().replace(" ", "_").replace("/", "")
                run.log({f"{c.id}/{slug}": wandb.Table(columns=list(hdr), data=rows)})
        _, hdr, rows = harness_table(report)
        if rows:
            run.log({"harness_overhead": wandb.Table(columns=hdr, data=rows)})
        _, hdr, rows = regimes_table(report)
        if rows:
            run.log({"regimes": wandb.Table(columns=hdr, data=rows)})
        if report.reconcile:
            run.summary["reconcile"] = " ".join(report.reconcile["answer"])
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
        wr.PanelGrid(runsets=[runset], panels=dashboard_panels(wr, report.runs)),
    ]
    rep.save()
    return f"wandb Report: {rep.url}"


def dashboard_metrics(runs) -> dict[str, list[str]]:
    """The metrics the Report's panels plot, by panel, named as the train runs logged them (callbacks/timing.py:
    each metric's median under its own name in the run summary, per-step rows with `elapsed_s`): only those the runs
    have, so that no panel is empty."""
    have = set()
    for r in runs:
        if r.d.get("mode") == "train":
            have |= set(r.d.get("metrics", {}))
            t = r.d.get("throughput") or {}
            have |= {k for k, v in t.items() if k.startswith("throughput/") and v is not None}
            have |= {f"ranked/{k}" for k, v in (r.d.get("ranked") or {}).items() if v is not None}
    # ranked by the figures a plan is judged by: a simulated rank's with its collectives priced (ranked/...,
    # runs.throughput.ranked_throughput), where the runs have them; else the measured (a simulated rank's compute only)
    ranked = "ranked/tokens_per_s_per_gpu" in have
    panels = {
        "step": ["step_ms"],
        "ops": [f"{op}_ms" for op in OPS],
        "throughput": ["ranked/tokens_per_s_per_gpu" if ranked else "throughput/device/items_per_sec"],
        "mfu": ["ranked/mfu" if ranked else "throughput/device/mfu"],
    }
    return {k: [m for m in v if m in have] for k, v in panels.items() if any(m in have for m in v)}


def dashboard_panels(wr, runs) -> list:
    """Step and op times over the run (x: the steps' own time, elapsed_s), and the runs ranked by their median step
    and by tokens/s a GPU and MFU (bar plots read the run summary: the medians; a simulated rank's with its
    collectives priced)."""
    m = dashboard_metrics(runs)
    out = []
    if "step" in m:
        out += [wr.LinePlot(title="step time, ms", x="elapsed_s", y=m["step"]), wr.BarPlot(title="median step, ms",
                                                                                             metrics=m["step"])]
    if "ops" in m:
        out.append(wr.LinePlot(title="op regions inside the step, ms", x="elapsed_s", y=m["ops"]))
    for key, title in (("throughput", "tokens/s a GPU"), ("mfu", "MFU (dense bf16 peak)")):
        if key in m:
            out.append(wr.BarPlot(title=title, metrics=m[key]))
    return out
