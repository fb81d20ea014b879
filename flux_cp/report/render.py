"""Rendering: tables, report.md, report.html (the markdown rendered by markdown-it, figures embedded), strict
report.json, and the output folder's PNGs (stale ones from an earlier report removed)."""

import base64
import json
import math
import re
from pathlib import Path

from flux_cp.predict.links import name_of

from .analysis import Report
from .figures import config_figures, reconcile_figure, regimes_figure
from .reconcile import WATERFALL
from .regimes import BEYOND, RING, TOLERANCE, USER_RUN, USER_SEQ, USER_SPEEDUP
from .runs import OPS, PART_LABEL, PARTS, Config, ratio


def _f(x, nd: int = 3, suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}g}{suffix}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def tables(c: Config) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of one configuration."""
    out = []
    hdr = ["W", "run", "step ms", "spread ms", "speedup", "loop ms", "loop speedup", "ideal", "Amdahl (compute)",
           "isolated ops + rest/W", "residual ms", "residual is", "comm source"]
    rows = []
    for r in c.rows:
        a, am = r.a, r.a.get("amdahl", {})
        res = am.get("residual") or {}
        named = am.get("residual_named")
        label = f"{r.W}" + (" (baseline)" if r.baseline else "") + (f" sim, rank {a['rank']}" if a["simulated"] else "")
        rows.append([label, a["run"],
                     _f(a["step_ms"]), f"{_f(a['step_spread_ms'], 2)} {a['step_spread_kind']}",
                     _f((a.get("speedup") or {}).get("projected_step"), 3, "x")
                     + (" (noisy)" if (a.get("noise") or {}).get("noisy") else ""),
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
    hdr = ["W", "MB by kind (nccl-tests size)", "priced ms by kind", "exposed ms by kind", "priced ms", "exposed ms",
           "step lower-upper ms", "source"]
    rows = []
    for r in c.rows:
        p = r.a["prediction"]
        rows.append([str(r.W), ", ".join(f"{k} {_f(v / 1e6)}" for k, v in p["bytes_by_kind"].items()) or "-",
                     ", ".join(f"{k} {_f(v)}" for k, v in p["priced_ms_by_kind"].items()) or "-",
                     ", ".join(f"{k} {_f(v)}" for k, v in p["exposed_ms_by_kind"].items()) or "-",
                     _f(p["priced_ms"]), _f(p["exposed_ms"]), f"{_f(p['lower_ms'])}-{_f(p['upper_ms'])}",
                     r.a["comm_source"]])
    out.append(("Communication per step and rank: priced with the link profile, placed on the step (predict.py)",
                hdr, rows))
    if c.profiled:  # what scales with W and what does not, by kernel class (--profile runs)
        bd = {w: r.d["profile"]["breakdown_ms"] for w, r in sorted(c.profiled.items())}
        base = bd.get(1, {})
        hdr = ["W", "run", *[f"{k} ms (x W=1)" for k in KERNEL_CLASSES]]
        rows = [[str(w), c.profiled[w].name, *[f"{_f(b.get(k))} ({_f(ratio(b.get(k), base.get(k)), 3)})"
                                               for k in KERNEL_CLASSES]] for w, b in bd.items()]
        out.append(("Kernel time per step by class, profiler (ratio to W=1; 1/W is perfect scaling)", hdr, rows))
    return out


KERNEL_CLASSES = ("attention", "gemm", "other", "optimizer", "busy")


def _against_target(h: dict, target: float) -> str:
    """Over or under the target, and whether the steps' spread lets the difference count."""
    if h["overhead_pct"] is None:
        return "-"
    side = "within" if h["within_target"] else "over" if h["overhead_pct"] > 0 else "faster by over"
    host = ""
    if h.get("host_changed"):
        speeds = [x for xs in h["host_op_us"].values() for x in xs]
        host = f" (the host's speed moved {min(speeds):.2g}-{max(speeds):.2g} us/op over the pair: not comparable)"
    return f"{side} {target:g}%" + (" (noisy: not significant)" if h["noisy"] else "") + host


def harness_table(report: Report) -> tuple[str, list[str], list[list[str]]]:
    """(title, header, rows): each Lightning row's step against its bare twin's."""
    h = report.harness or {"rows": [], "target_pct": None}
    hdr = ["config", "strategy", "W", "Lightning step ms", "bare step ms", "overhead", "spread ms", "target",
           "loop overhead", "Lightning run", "bare run"]
    rows = [[", ".join(r["configs"]), r["strategy"], str(r["W"]), _f(r["lightning_step_ms"]), _f(r["bare_step_ms"]),
             "-" if r["overhead_pct"] is None else f"{r['overhead_pct']:+.1f}%",
             f"{_f(r['noise']['spread_ms'], 2)} {r['noise']['kind']}", _against_target(r, h["target_pct"]),
             "-" if r["loop_overhead_pct"] is None else f"{r['loop_overhead_pct']:+.1f}%",
             _rel(report, r["lightning_run"]), _rel(report, r["bare_run"])] for r in h["rows"]]
    return "Harness overhead against the bare loop", hdr, rows


def _rel(report: Report, path: str) -> str:  # every run was found under the root
    return str(Path(path).relative_to(report.root))


def _pooled(g: dict, target: float) -> str:
    if "pooled_ci95_pct" not in g:
        return ""
    lo, hi = g["pooled_ci95_pct"]
    n_lit, n_bare = g["pooled_steps"]
    return (f"; all steps pooled ({n_lit} Lightning, {n_bare} bare): {g['pooled_overhead_pct']:+.1f}% "
            f"(95% interval {lo:+.1f}% to {hi:+.1f}%): {g['pooled_verdict']}"
            + (f" at +-{target:g}%" if g["pooled_verdict"] in ("within", "not resolved") else ""))


def harness_md(report: Report) -> list[str]:
    """The section, when there are bare-loop runs: the table, then the bare runs no Lightning row matched."""
    h = report.harness
    if not h or not (h["rows"] or h["unmatched_bare"] or h.get("interleaved")):
        return []
    title, hdr, rows = harness_table(report)
    out = [f"## {title}", "",
           f"Overhead = Lightning step median / bare step median - 1, against the issue's target of <= "
           f"{h['target_pct']:g}% at every W. The twin: the latest `--harness bare` run with the same device, model, "
           "data and run settings but bookkeeping (harness, loader, workers, SIGTERM check, timing and profiling, "
           "output, steps). A Lightning run with `--timing` on carries its op-region events; the bare loop has none.",
           ""]
    out += [_md_table(hdr, rows), ""] if rows else ["No Lightning row has a bare twin.", ""]
    if h.get("repeats"):  # the same pair with other data seeds: the overhead's median over the pairs
        out += ["Repeated pairs (other data seeds, run interleaved): " + "; ".join(
            f"{g['strategy']} W={g['W']}: median {g['overhead_pct_median']:+.1f}% over {g['pairs']} pairs "
            f"(range {g['overhead_pct_range'][0]:+.1f}% to {g['overhead_pct_range'][1]:+.1f}%), "
            f"{'within' if g['within_target'] else 'over'} {h['target_pct']:g}%" + _pooled(g, h["target_pct"])
            for g in h["repeats"]) + ".", ""]
    if h.get("interleaved"):  # a bare twin inside the Lightning run: both on the same host within seconds
        out += ["Interleaved twins (`--interleave-bare`: bare steps in blocks between the Lightning steps of one run): "
                + "; ".join(f"{g['strategy']} W={g['W']}: {g['overhead_pct']:+.1f}% (95% interval "
                            f"{g['ci95_pct'][0]:+.1f}% to {g['ci95_pct'][1]:+.1f}%, {g['steps'][0]} Lightning and "
                            f"{g['steps'][1]} bare steps): {g['verdict']}" for g in h["interleaved"]) + ".", ""]
    if bare := h["unmatched_bare"]:  # recipe and regime suites run the bare loop alone: name a few, count the rest
        more = f", and {len(bare) - 5} more (report.json: harness.unmatched_bare)" if len(bare) > 6 else ""
        out += [f"Bare runs with no Lightning twin among the rows ({len(bare)}): " + ", ".join(
            f"{_rel(report, u['path'])} (W={u['W']})" for u in (bare[:5] if more else bare)) + more + ".", ""]
    return out



def _md_table(hdr, rows) -> str:
    esc = [[str(x).replace("|", "\\|") for x in row] for row in [hdr, *rows]]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(hdr)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc[1:]])


def _skipped_rows(report: Report) -> list[list[str]]:
    return [[s.status, str(s.path.relative_to(report.root)), s.reason] for s in report.skipped]


def _intro(report: Report) -> list[str]:
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
        "noisy'.",
    ]


def reconcile_md(rec: dict | None, figs: list[Path]) -> list[str]:
    out = ["## Reconciling the 1.66x", ""]
    if rec is None:
        return out + ["No configuration with a W=1 baseline and a W > 1 run: nothing to reconcile.", ""]
    out += [f"*{rec['note']}*", ""] if rec["note"] else []
    out += [" ".join(rec["answer"]), ""]
    out += [f"![{p.stem}]({p.name})" for p in figs] + [""]
    hdr = ["W", "predicted speedup", "bounds (none .. all overlapped)", "predicted ms", "basis", "measured",
           "error", *WATERFALL, "isolated op speedups"]
    rows = []
    for r in rec["rows"]:
        lo, hi = r["bounds"]
        meas = f"{r['measured_speedup']:.2f}x ({r['measured_run']})" if "measured_speedup" in r else "-"
        err = f"{r['error_pct']:+.1f}%" if "error_pct" in r else "-"
        iso = ", ".join(f"{k} {v:.2f}x" for k, v in r["isolated"].items() if v) or "no ops runs"
        rows.append([str(r["W"]), f"{r['predicted_speedup']:.2f}x" + (" (noisy)" if r["noisy"] else ""),
                     f"{lo:.2f}-{hi:.2f}x" if lo else "-", _f(r["predicted_ms"]), r["basis"], meas, err,
                     *[f"{r['waterfall_ms'][k]:+.3g}" for k in WATERFALL], iso])
    out += [f"W=1 step: {rec['baseline_ms']:.4g} ms ({rec['baseline_run']}); waterfall columns in ms sum to the "
            "predicted step.", "", _md_table(hdr, rows), ""]
    if rec["alternatives"]:
        hdr = ["W", "strategy", "compile", "speedup vs the same W=1 step", "bounds", "basis", "run"]
        rows = [[str(a["W"]), a["strategy"], a["compile"], f"{a['speedup']:.2f}x",
                 f"{a['bounds'][0]:.2f}-{a['bounds'][1]:.2f}x" if a["bounds"] else "-", a["basis"], a["run"]]
                for a in rec["alternatives"]]
        out += ["### The configurations the tool offers, predicted the same way", "", _md_table(hdr, rows), ""]
    return out


REGIMES_TITLE = "Regimes: which W=1 baseline and which work per step give 1.66x"


def _speedup_cell(s: dict, w: str) -> str:
    if w not in s["speedups"]:
        return "-"
    lo, hi = s["bounds"][w]
    what = f" ({lo:.2f}-{hi:.2f})" if lo is not None and hi is not None else (
        " measured" if s["basis"][w] == "measured" else "")
    return f"{s['speedups'][w]:.2f}x{what}"


def _host_cell(s: dict) -> str:
    """The regime's host: emulated slowdown, and the W=2 run's measured host speed where recorded."""
    us = s.get("host_op_us")
    return s.get("host", "host as is") + (f", {us:.2g} us/op" if us is not None else "")


def regimes_table(report: Report) -> tuple[str, list[str], list[list[str]]]:
    """(title, header, rows): one row per regime, its speedup at each W (bounds: nothing .. everything overlapped)."""
    summary = (report.regimes or {}).get("summary") or {}
    ws = sorted({2, 4, 8} | {int(w) for s in summary.values() for w in s["speedups"]})
    hdr = ["#", "baseline (W=1)", "batch", "depth", "compile", "Lightning sync", "host",
           *[f"W={w}" for w in ws], "verdict"]
    rows = []
    for i, s in enumerate(summary.values(), 1):
        b = s["baseline"]
        mark = "" if not s["kernel_note"] else " (*)" if b["sdpa_kernel"] != "auto" else " (?)"
        rows.append([str(i), f"{b['kind']}{mark}, {_f(b['step_ms'])} ms", str(s["batch"]), s["depth"], s["compile"],
                     s["lightning_sync"], _host_cell(s), *[_speedup_cell(s, str(w)) for w in ws],
                     s["verdict"]])
    return REGIMES_TITLE, hdr, rows


def regimes_md(report: Report, figs: list[Path]) -> list[str]:
    reg = report.regimes or {}
    out = [f"## {REGIMES_TITLE}", ""]
    user = (f"torch's ring (`cp: {USER_RUN['cp']}`, `rotate: {USER_RUN['rotate']}`), {USER_RUN['weights'].upper()}, "
            f"SDPA setting {USER_RUN['sdpa_backend']}, bf16, {USER_SEQ} tokens")
    if not reg.get("summary"):
        out += [f"No W >= 2 run of the user's configuration ({user}) paired with a W=1 baseline of the same "
                "device, model, data and run settings: no regime to judge.", ""]
    else:
        title, hdr, rows = regimes_table(report)
        lo, hi = USER_SPEEDUP * (1 - TOLERANCE), USER_SPEEDUP * (1 + TOLERANCE)
        out += [f"Each W >= 2 run of the user's configuration ({user}; batch, depth, compile and harness vary) "
                "divided into every W=1 baseline with the same device, model, data and run settings but the "
                f"strategy's: a plain `--cp none` step named by the SDPA kernel it ran, or {RING} (the seed's "
                "--nproc-per-node 1). Simulated ranks: the predicted step (communication priced with "
                f"{name_of(report.link)}), bounds nothing .. everything overlapped; real processes: measured. "
                f"Reproduces: W=2 in {lo:.3g}-{hi:.3g}x (the user's {USER_SPEEDUP}x +-{TOLERANCE:.0%}) and no larger "
                f"W at {BEYOND:g}x the W=2 speedup or more; incomplete without a W=2 run.", "",
                _md_table(hdr, rows), ""]
        notes: dict[str, list[str]] = {}
        for i, s in enumerate(reg["summary"].values(), 1):
            if s["kernel_note"]:
                notes.setdefault(s["kernel_note"], []).append(str(i))
        if notes:
            out += ["Rows that pair a W >= 2 ring run (the ring pins flash) with a W=1 baseline of another SDPA kernel "
                    "are marked (*), with a baseline whose kernel is not recorded (?):", ""]
            out += [f"- {n} (row{'s' if len(nums) > 1 else ''} {', '.join(nums)})" for n, nums in notes.items()] + [""]
        for i, (rid, s) in enumerate(reg["summary"].items(), 1):
            extra = "".join(f" ({n})" for n in s["notes"])
            out.append(f"- **{i}. {s['verdict']}** ({rid}): {s['reason']}. Mechanism: {s['mechanism']}.{extra}")
            if s.get("best") is not None:
                out.append(f"  - **What to run in regime {i}**: {best_line(s)}")
        out += [""] + [f"![{p.stem}]({p.name})" for p in figs] + [""]
    if reg.get("unpaired"):
        out += ["W >= 2 runs of the user's configuration with no W=1 baseline of their settings: " + ", ".join(
            f"{u['run']} (W={u['W']}, batch {u['batch']}, depth {u['depth']}, {u['compile']}, {u['lightning_sync']})"
            for u in reg["unpaired"]) + ".", ""]
    out += [f"- {n}" for n in reg.get("notes", [])] + ([""] if reg.get("notes") else [])
    return out


def best_line(s: dict) -> str:
    """A reproducing regime's fastest configuration at each W, against the user's ring at that W."""
    if not s["best"]:
        return "no other configuration was run in this regime (its device, model, data, host and harness)"
    if all(b["users"] for b in s["best"].values()):
        return ("nothing faster among the runs: the user's configuration is the fastest run in this regime (its "
                "device, model, data, host and harness); configs/suites/flux_recipe_slowhost.yaml runs the others")
    def one(w, b):
        recipe = f" = {b['recipe']}" if b.get("recipe") else ""
        ring = f"; the user's ring {s['speedups'][w]:.2f}x" if w in s["speedups"] else ""
        mem = f", peak {b['peak_gib']:.3g} GiB per rank" if b.get("peak_gib") is not None else ""
        return f"W={w} {b['strategy']}, {b['compile']}{recipe}: {b['speedup']:.2f}x ({b['basis']}{ring}{mem})"

    return "; ".join(one(w, b) for w, b in sorted(s["best"].items(), key=lambda x: int(x[0])))


def regime_lines(report: Report) -> list[str]:
    """What the CLI prints: one line per regime with its verdict (and, where it reproduces, what to run)."""
    summary = (report.regimes or {}).get("summary") or {}
    return [f"regime {i}. {rid}: {s['verdict']} ({s['reason']})" + (f"; what to run: {best_line(s)}"
                                                                     if s.get("best") is not None else "")
            for i, (rid, s) in enumerate(summary.items(), 1)]


def levers_md(report: Report) -> list[str]:
    """Each lever's A/B in one call (levers.py): the rank's step and the predicted step, before and after."""
    lv = report.levers or {}
    if not lv.get("rows"):
        return []
    hdr = ["lever", "strategy", "build", "W", "before -> after", "rank step ms", "predicted ms", "change",
           "exposed comm ms", "peak GiB", "basis", "suite"]
    rows = [[r["lever"], r["strategy"], r["build"], str(r["W"]), f"{r['before']} -> {r['after']}",
             " -> ".join(_f(x) for x in r["step_ms"]), " -> ".join(_f(x) for x in r["predicted_step_ms"]),
             "-" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%",
             " -> ".join(_f(x) for x in r["exposed_comm_ms"]), " -> ".join(_f(x) for x in r["peak_gib"]), r["basis"],
             r["suite"]] for r in lv["rows"]]
    out = ["## Levers: one setting changed, in one call", "",
           "Pairs of runs of one suite's folder (one call, one host) whose settings differ only in the lever's, at "
           "the same W and harness; the rank's measured step and the predicted step (its collectives priced) "
           "before and after. Repeated runs: their median run.", "", _md_table(hdr, rows), ""]
    return out + [f"- {n}" for n in lv.get("notes", [])] + ([""] if lv.get("notes") else [])


def render_md(report: Report, figs: dict[str, list[Path]]) -> str:
    out = ["# flux-cp report", "", *[p + "\n" for p in _intro(report)]]
    out += reconcile_md(report.reconcile, figs.get("reconcile", []))
    out += regimes_md(report, figs.get("regimes", []))
    out += levers_md(report)
    out += harness_md(report)
    if not report.configs:
        out.append("No complete train runs: nothing to reconcile.\n")
    for c in report.configs:
        out += [f"## {c.id}: {c.title}", ""]
        out += [f"- {n}" for n in c.notes] + ([""] if c.notes else [])
        out += ["**Verdict**", ""] + [f"- {r.a['verdict']}" for r in c.rows] + [""]
        for title, hdr, rows in tables(c):
            out += [f"### {title}", "", _md_table(hdr, rows), ""]
        if not any(r.a["isolated_call_ms"] for r in c.rows):
            out += ["No ops runs for this configuration: isolated op times not measured.", ""]
        out += [f"![{p.stem}]({p.name})" for p in figs.get(c.id, [])] + [""]
    if report.iso:
        keys = ("run", "op", "seq_len", "world", "cp", "method", "sdpa_backend", "device_ms", "host_ms")
        # a seed-compat row times a loop of calls between two events: no host time of its own ("-")
        rows = [[_f(r[k]) if isinstance(r[k], float) or r[k] is None else str(r[k]) for k in keys] for r in report.iso]
        out += ["## Isolated op times (ops runs)", "", _md_table(list(keys), rows), ""]
    else:
        out += ["## Isolated op times (ops runs)", "", "No ops runs.", ""]
    if report.skipped:
        out += ["## Skipped and partial runs", "", _md_table(["status", "path", "reason"], _skipped_rows(report)), ""]
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
    """What the CLI prints: the reconciliation's answer and every row's verdict."""
    out = [f"reconcile: {s}" for s in (report.reconcile or {}).get("answer", [])]
    for c in report.configs:
        out += [f"{c.id} {c.strategy}: {r.a['verdict']}" for r in c.rows]
    for h in (report.harness or {}).get("rows", []):
        if h["overhead_pct"] is not None:
            out.append(f"harness {', '.join(h['configs'])} W={h['W']}: Lightning step {h['overhead_pct']:+.1f}% "
                       f"against the bare loop's ({_against_target(h, report.harness['target_pct'])})")
    return out
