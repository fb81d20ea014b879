"""The sections of report.md that read across configurations: the regimes, the reconciliation of the 1.66x, the
levers, the harness's cost. A table wider than tables.MAX_COLUMNS is split by what its columns say (a "#" column
ties the parts' rows together); the whole rows stay in report.json, and regimes_table / harness_table (wandb's
tables) keep every column."""

from pathlib import Path

from flux_cp.predict.links import name_of

from .analysis import Report
from .devices import across_devices_md
from .host_axis import host_axis_md
from .reconcile import WATERFALL, labels
from .regimes import BEYOND, RING, TOLERANCE, USER_RUN, USER_SEQ, USER_SPEEDUP
from .tables import MAX_COLUMNS, _f, columns, md_table

# ---------------------------------------------------------------- regimes

REGIMES_TITLE = "Regimes: which W=1 baseline and which work per step give 1.66x"
REGIME_AXES = ["#", "baseline (W=1)", "batch", "depth", "compile", "Lightning sync", "host"]


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
    """(title, header, rows): one row per regime, its speedup at each W (bounds: nothing .. everything overlapped).
    Every column: report.md shows it in two tables (regimes_md)."""
    summary = (report.regimes or {}).get("summary") or {}
    ws = sorted({2, 4, 8} | {int(w) for s in summary.values() for w in s["speedups"]})
    hdr = [*REGIME_AXES, *[f"W={w}" for w in ws], "verdict"]
    rows = []
    for i, s in enumerate(summary.values(), 1):
        b = s["baseline"]
        mark = "" if not s["kernel_note"] else " (*)" if b["sdpa_kernel"] != "auto" else " (?)"
        rows.append([str(i), f"{b['kind']}{mark}, {_f(b['step_ms'])} ms", str(s["batch"]), s["depth"], s["compile"],
                     s["lightning_sync"], _host_cell(s), *[_speedup_cell(s, str(w)) for w in ws],
                     s["verdict"]])
    return REGIMES_TITLE, hdr, rows


def _split_regimes(hdr: list[str], rows: list[list[str]]) -> list[tuple[list[str], list[list[str]]]]:
    """The regime table as report.md shows it: what each regime is, then its speedups by W and verdict (the W
    columns in groups where there are more than fit)."""
    ws = [h for h in hdr if h.startswith("W=")]
    per = MAX_COLUMNS - 2
    out = [columns(hdr, rows, REGIME_AXES)]
    out += [columns(hdr, rows, ["#", *ws[i:i + per], "verdict"]) for i in range(0, len(ws), per)]
    return out


def regimes_md(report: Report, figs: list[Path]) -> list[str]:
    reg = report.regimes or {}
    out = [f'## {REGIMES_TITLE} <a id="regimes"></a>', ""]
    user = (f"torch's ring (`cp: {USER_RUN['cp']}`, `rotate: {USER_RUN['rotate']}`), {USER_RUN['weights'].upper()}, "
            f"SDPA setting {USER_RUN['sdpa_backend']}, bf16, {USER_SEQ} tokens")
    if not reg.get("summary"):
        out += [f"No W >= 2 run of the user's configuration ({user}) paired with a W=1 baseline of the same "
                "device, model, data and run settings: no regime to judge.", ""]
    else:
        _, hdr, rows = regimes_table(report)
        lo, hi = USER_SPEEDUP * (1 - TOLERANCE), USER_SPEEDUP * (1 + TOLERANCE)
        out += [f"Each W >= 2 run of the user's configuration ({user}; batch, depth, compile and harness vary) "
                "divided into every W=1 baseline with the same device, model, data and run settings but the "
                f"strategy's: a plain `--cp none` step named by the SDPA kernel it ran, or {RING} (the seed's "
                "--nproc-per-node 1). Simulated ranks: the predicted step (communication priced with "
                f"{name_of(report.link)}), bounds nothing .. everything overlapped; real processes: measured. "
                f"Reproduces: W=2 in {lo:.3g}-{hi:.3g}x (the user's {USER_SPEEDUP}x +-{TOLERANCE:.0%}) and no larger "
                f"W at {BEYOND:g}x the W=2 speedup or more; incomplete without a W=2 run. The first table says what "
                "each regime is, the second its speedups (rows by #).", ""]
        for h, r in _split_regimes(hdr, rows):
            out += [md_table(h, r), ""]
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
        out += [""] + [f"![{p.stem}]({p.name})" for p in figs] + [""] + across_devices_md(reg.get("across_devices"))
        out += host_axis_md(report)
    if reg.get("unpaired"):
        out += ["W >= 2 runs of the user's configuration with no W=1 baseline of their settings: " + ", ".join(
            f"{u['run']} (W={u['W']}, batch {u['batch']}, depth {u['depth']}, {u['compile']}, {u['lightning_sync']})"
            for u in reg["unpaired"]) + ".", ""]
    out += [f"- {n}" for n in reg.get("notes", [])] + ([""] if reg.get("notes") else [])
    return out


def best_line(s: dict) -> str:
    """A regime's fastest configuration at each W, against the user's ring at that W."""
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
    """What the CLI prints: one line per regime with its verdict (and, where it names one, what to run)."""
    summary = (report.regimes or {}).get("summary") or {}
    return [f"regime {i}. {rid}: {s['verdict']} ({s['reason']})" + (f"; what to run: {best_line(s)}"
                                                                     if s.get("best") is not None else "")
            for i, (rid, s) in enumerate(summary.items(), 1)]


# ---------------------------------------------------------------- reconciling the 1.66x


def reconcile_md(rec: dict | None, figs: list[Path]) -> list[str]:
    out = ['## Reconciling the 1.66x <a id="reconcile"></a>', ""]
    if rec is None:
        return out + ["No configuration with a W=1 baseline and a W > 1 run: nothing to reconcile.", ""]
    out += [f"*{rec['note']}*", ""] if rec["note"] else []
    out += [" ".join(rec["answer"]), ""]
    out += [f"![{p.stem}]({p.name})" for p in figs] + [""]
    b = rec["baseline"]
    regime = f", regime {b['number']} of the regime table" if b.get("number") else ""
    hdr = ["W", "speedup", "basis", "predicted", "bounds (none .. all overlapped)", "predicted ms", "measured", "error"]
    rows, runs = [], []
    for r in rec["rows"]:
        lo, hi = r["bounds"]
        noisy = " (noisy)" if r["noisy"] else ""
        rows.append([str(r["W"]), f"{r.get('speedup', r['predicted_speedup']):.2f}x{noisy}",
                     r.get("speedup_basis", "predicted" if lo else "measured"), f"{r['predicted_speedup']:.2f}x",
                     f"{lo:.2f}-{hi:.2f}x" if lo else "-", _f(r["predicted_ms"]),
                     f"{r['measured_speedup']:.2f}x" if "measured_speedup" in r else "-",
                     f"{r['error_pct']:+.1f}%" if "error_pct" in r else "-"])
        runs.append(f"- W={r['W']}: {r['basis']}, {r['run']}" + (f"; measured {r['measured_run']}"
                                                                  if "measured_run" in r else ""))
    out += [f"Every speedup divides the W=1 step {b['kind']} ({b['run']}, {b['step_ms']:.4g} ms{regime}).", "",
            md_table(hdr, rows), "", "Runs:", "", *runs, ""]
    hdr = ["W", *WATERFALL, "isolated op speedups"]
    rows, unsplit = [], {}
    for r in rec["rows"]:
        names = labels(r.get("split") or {"attention": True, "host": True})
        for k in WATERFALL:
            if not names[k]:
                unsplit.setdefault(k, []).append(str(r["W"]))
        rows.append([str(r["W"]), *[f"{r['waterfall_ms'][k]:+.3g}" if names[k] else "not recorded" for k in WATERFALL],
                     ", ".join(f"{k} {v:.2f}x" for k, v in r["isolated"].items() if v) or "no ops runs"])
    out += ["Where the W=1 step's time goes at each W, ms (the columns sum to the predicted step):", "",
            md_table(hdr, rows), ""]
    out += [f"- {k} not recorded at W={', '.join(ws)} (the runs time no "
            + ("device idle or busy time: the host-bound share" if k == WATERFALL[2] else "attention regions: it")
            + f" is inside {WATERFALL[3]})" for k, ws in unsplit.items()] + ([""] if unsplit else [])
    if rec["alternatives"]:
        hdr = ["W", "strategy", "compile", "speedup vs the same W=1 step", "bounds", "basis", "run"]
        rows = [[str(a["W"]), a["strategy"], a["compile"], f"{a['speedup']:.2f}x",
                 f"{a['bounds'][0]:.2f}-{a['bounds'][1]:.2f}x" if a["bounds"] else "-", a["basis"], a["run"]]
                for a in rec["alternatives"]]
        out += ["### The other configurations, against the same W=1 step", "", md_table(hdr, rows), ""]
    return out


# ---------------------------------------------------------------- levers


def levers_md(report: Report) -> list[str]:
    """Each lever's A/B in one call (levers.py): what changed, then the rank's step and the predicted step, before
    and after (rows by #)."""
    lv = report.levers or {}
    if not lv.get("rows"):
        return []
    what = [[str(i), r["lever"], r["strategy"], r["build"], str(r["W"]), f"{r['before']} -> {r['after']}", r["basis"],
             r["suite"]] for i, r in enumerate(lv["rows"], 1)]
    effect = [[str(i), " -> ".join(_f(x) for x in r["step_ms"]), " -> ".join(_f(x) for x in r["predicted_step_ms"]),
               "-" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%",
               " -> ".join(_f(x) for x in r["exposed_comm_ms"]), " -> ".join(_f(x) for x in r["peak_gib"])]
              for i, r in enumerate(lv["rows"], 1)]
    out = ["## Levers: one setting changed, in one call", "",
           "Pairs of runs of one suite's folder (one call, one host) whose settings differ only in the lever's, at "
           "the same W and harness; the rank's measured step and the predicted step (its collectives priced) "
           "before and after. Repeated runs: their median run.", "",
           md_table(["#", "lever", "strategy", "build", "W", "before -> after", "basis", "suite"], what), "",
           md_table(["#", "rank step ms", "predicted ms", "change", "exposed comm ms", "peak GiB"], effect), ""]
    return out + [f"- {n}" for n in lv.get("notes", [])] + ([""] if lv.get("notes") else [])


# ---------------------------------------------------------------- the harness's cost


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
    """(title, header, rows): each Lightning row's step against its bare twin's; every column (harness_md shows
    them in two tables)."""
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
    """The section, when there are bare-loop runs: the overheads, the runs (rows by #), then the bare runs no
    Lightning row matched."""
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
    if rows:
        hdr, rows = ["#", *hdr], [[str(i), *r] for i, r in enumerate(rows, 1)]
        for row in rows:  # the configurations by their sections' anchors
            row[1] = ", ".join(f"[{c}](#{c})" for c in row[1].split(", "))
        for names in (["#", "strategy", "W", "Lightning step ms", "bare step ms", "overhead", "spread ms", "target"],
                      ["#", "config", "loop overhead", "Lightning run", "bare run"]):
            out += [md_table(*columns(hdr, rows, names)), ""]
    else:
        out += ["No Lightning row has a bare twin.", ""]
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
    if h.get("interleaved_pooled"):  # over data seeds: what the "resolved over >= 5 runs" reads
        out += ["**Interleaved twins pooled over runs** (the mean of the runs' overheads; runs and steps resampled): "
                + "; ".join(f"{g['strategy']} W={g['W']}: {g['overhead_pct']:+.1f}% over {g['runs']} runs (95% "
                            f"interval {g['ci95_pct'][0]:+.1f}% to {g['ci95_pct'][1]:+.1f}%): {g['verdict']} "
                            f"{h['target_pct']:g}%" for g in h["interleaved_pooled"]) + ".", ""]
    if bare := h["unmatched_bare"]:  # recipe and regime suites run the bare loop alone: name a few, count the rest
        more = f", and {len(bare) - 5} more (report.json: harness.unmatched_bare)" if len(bare) > 6 else ""
        out += [f"Bare runs with no Lightning twin among the rows ({len(bare)}): " + ", ".join(
            f"{_rel(report, u['path'])} (W={u['W']})" for u in (bare[:5] if more else bare)) + more + ".", ""]
    return out
