"""Rendering: report.md (the verdict first, then the method, then the sections and each configuration), report.html
(the markdown rendered by markdown-it, figures embedded), strict report.json, and the output folder's PNGs (stale
ones from an earlier report removed). Tables: tables.py (a configuration's) and sections.py (across them), none
wider than tables.MAX_COLUMNS."""

import base64
import json
import math
import re
from pathlib import Path

from flux_cp.predict.links import name_of

from .analysis import Report
from .efficiency import efficiency_md
from .figures import config_figures, reconcile_figure, regimes_figure
from .headline import headline_md
from .sections import (  # noqa: F401  (harness_table, regimes_table, best_line: wandb_out's and the CLI's)
    _against_target,
    best_line,
    harness_md,
    harness_table,
    levers_md,
    reconcile_md,
    regime_lines,
    regimes_md,
    regimes_table,
)
from .tables import _f, config_titles, md_table, tables

ISO_KEYS = ("op", "seq_len", "world", "cp", "method", "sdpa_backend", "device_ms", "host_ms")  # a table per ops run


def _skipped_rows(report: Report) -> list[list[str]]:
    return [[s.status, str(s.path.relative_to(report.root)), s.reason] for s in report.skipped]


def _intro(report: Report) -> list[str]:
    """The method: what was found, how communication is priced, how the parts are computed."""
    n_train = sum(r.d["mode"] == "train" for r in report.runs)
    timers = sorted({r.timer for r in report.runs if r.d["mode"] == "train"})
    cpu = (f"CPU runs: {name_of(report.cpu_link)}" if report.cpu_link else
           "CPU runs: communication not priced (no --cpu-link profile; tools/measure_links.py measures one)")
    return [
        f"Runs under `{report.root}`: {n_train} train, {len(report.runs) - n_train} ops, "
        f"{len(report.skipped)} skipped or partial. Step times: {', '.join(timers) or '-'} "
        "(CUDA events on GPU, `time.perf_counter` on CPU).",
        f"Link profiles: GPU runs {name_of(report.link)}; {cpu}. Each collective is priced as latency + bus bytes / "
        "bus bandwidth (nccl-tests' busbw convention) and placed on the step by `predict/step_model.py`: blocking ones "
        "add their time, asynchronous ones only what outlasts the compute before their consumer.",
        "Parts: op regions are timed inside the step (summed over blocks); the K/V exchange runs inside the SDPA "
        "region and is taken out of it; other compute = step - op regions - gradient sync - idle. Amdahl (compute) = "
        "W=1 compute parts each divided by its measured speedup; the residual is named comm, host or sync. A "
        "comparison whose step spread (IQR, else min-max) exceeds the difference it reports is 'not conclusive: "
        "noisy'. Where a run records no device idle or busy time (the bare loop's before it timed them), host-bound "
        "time is not told from compute: the report says 'host-bound share not recorded'.",
    ]


def _method_md(report: Report, titles: dict[str, str]) -> list[str]:
    out = ["## Method", "", *[p + "\n" for p in _intro(report)]]
    if report.configs:
        out += ["Configurations (a section each, below the regimes, the reconciliation, the levers and the harness):",
                "", *[f"- [{titles[c.id]}](#{c.id})" for c in report.configs], ""]
    return out


def _config_md(c, title: str, figs: list[Path]) -> list[str]:
    out = [f'## {title} <a id="{c.id}"></a>', "", f"*{c.title}*", ""]
    out += [f"- {n}" for n in c.notes] + ([""] if c.notes else [])
    out += ["**Verdict**", ""] + [f"- {r.a['verdict']}" for r in c.rows] + [""]
    for t, hdr, rows in tables(c):
        out += [f"### {t}", "", md_table(hdr, rows), ""]
    if not any(r.a["isolated_call_ms"] for r in c.rows):
        out += ["No ops runs for this configuration: isolated op times not measured.", ""]
    return out + [f"![{p.stem}]({p.name})" for p in figs] + [""]


def _isolated_md(report: Report) -> list[str]:
    out = ["## Isolated op times (ops runs)", ""]
    if not report.iso:
        return out + ["No ops runs.", ""]
    by_run: dict[str, list[dict]] = {}
    for r in report.iso:
        by_run.setdefault(r["run"], []).append(r)
    for run, rs in by_run.items():
        # a seed-compat row times a loop of calls between two events: no host time of its own ("-")
        rows = [[_f(r[k]) if isinstance(r[k], float) or r[k] is None else str(r[k]) for k in ISO_KEYS] for r in rs]
        out += [f"Run `{run}`:", "", md_table(list(ISO_KEYS), rows), ""]
    return out


def render_md(report: Report, figs: dict[str, list[Path]]) -> str:
    """The verdict, the method, the sections across configurations, each configuration, ops runs, skipped runs."""
    titles = config_titles(report.configs)
    out = ["# flux-cp report", "", *headline_md(report), *_method_md(report, titles)]
    out += regimes_md(report, figs.get("regimes", []))
    out += reconcile_md(report.reconcile, figs.get("reconcile", []))
    out += levers_md(report)
    out += harness_md(report)
    out += efficiency_md(report.efficiency or [])
    if not report.configs:
        out.append("No complete train runs: nothing to reconcile.\n")
    for c in report.configs:
        out += _config_md(c, titles[c.id], figs.get(c.id, []))
    out += _isolated_md(report)
    if report.skipped:
        out += ["## Skipped and partial runs", "", md_table(["status", "path", "reason"], _skipped_rows(report)), ""]
    return "\n".join(out)


CSS = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}table{border-collapse:collapse;"
       "font-size:12px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
       "td:nth-child(2){text-align:left}img{max-width:100%;margin:.5em}code{background:#f4f4f4}")


def render_html(md: str, out: Path) -> str:
    """report.md rendered (markdown-it, tables on), each figure inlined as base64: one self-contained file."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(md)

    def inline(m):
        p = out / m.group(1)
        return f'src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}"' if p.exists() else m.group(0)

    body = re.sub(r'src="([^"/]+\.png)"', inline, body)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>flux-cp report</title><style>{CSS}</style>"
            f"</head><body>\n{body}</body></html>\n")


def strict(x):
    """NaN and infinities -> None, so that report.json is strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict(v) for v in x]
    return x if isinstance(x, (str, int, bool)) or x is None else str(x)


FIGURE = re.compile(r"^(c\d+_(breakdown|speedup|ops)|reconcile|regimes)\.png$")  # what this module writes


def write(report: Report, out: Path) -> dict:
    """report.md, report.html, report.json and the PNGs in out (stale PNGs of an earlier report removed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for p in out.glob("*.png"):
        if FIGURE.match(p.name):
            p.unlink()
    figs = config_figures(report, out)
    figs["reconcile"] = reconcile_figure(report.reconcile, out)
    figs["regimes"] = regimes_figure(report.regimes, out)
    paths = {"md": out / "report.md", "html": out / "report.html", "json": out / "report.json"}
    md = render_md(report, figs)
    paths["md"].write_text(md)
    paths["html"].write_text(render_html(md, out))
    paths["json"].write_text(json.dumps(strict(report.to_dict()), indent=1, allow_nan=False))
    paths["png"] = [p for ps in figs.values() for p in ps]
    return paths


def verdict_lines(report: Report) -> list[str]:
    """What the CLI prints: the verdict the report opens with, the reconciliation's answer and every row's verdict."""
    out = [f"verdict: {ln.lstrip('- ').replace('**', '')}" for ln in headline_md(report)[2:] if ln.strip()]
    out += [f"reconcile: {s}" for s in (report.reconcile or {}).get("answer", [])]
    for c in report.configs:
        out += [f"{c.id} {c.strategy}: {r.a['verdict']}" for r in c.rows]
    for h in (report.harness or {}).get("rows", []):
        if h["overhead_pct"] is not None:
            out.append(f"harness {', '.join(h['configs'])} W={h['W']}: Lightning step {h['overhead_pct']:+.1f}% "
                       f"against the bare loop's ({_against_target(h, report.harness['target_pct'])})")
    return out
