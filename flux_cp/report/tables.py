"""Tables of report.md: the cell formats, the markdown table (at most MAX_COLUMNS columns: a wider one is split by
what its columns say, and what does not fit, run paths and sources, goes to a list under it), and each
configuration's tables and title. report.json keeps every figure whole (analysis.py's rows)."""

import math

from .runs import OPS, PART_LABEL, PARTS, Config, ratio

MAX_COLUMNS = 8  # report.md and report.html: a table any wider is split
KERNEL_CLASSES = ("attention", "gemm", "other", "optimizer", "busy")
COMM_PARTS = ("comm_kv", "comm_grad", "idle")


def _f(x, nd: int = 3, suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}g}{suffix}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def md_table(hdr, rows) -> str:
    if len(hdr) > MAX_COLUMNS:  # every caller splits first: a wide table is a bug, not a layout
        raise ValueError(f"a report table of {len(hdr)} columns (at most {MAX_COLUMNS}): {hdr}")
    esc = [[str(x).replace("|", "\\|") for x in row] for row in [hdr, *rows]]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(hdr)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc[1:]])


def columns(hdr: list[str], rows: list[list[str]], names: list[str]) -> tuple[list[str], list[list[str]]]:
    """The named columns of a table (a split of a wider one)."""
    idx = [hdr.index(n) for n in names]
    return [hdr[i] for i in idx], [[row[i] for i in idx] for row in rows]


def _w_label(r) -> str:
    return f"{r.W}" + (" (baseline)" if r.baseline else "") + (f" sim, rank {r.a['rank']}" if r.a["simulated"] else "")


def tables(c: Config) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of one configuration, each at most MAX_COLUMNS wide; its runs' comm sources are the
    communication table's last column."""
    out = []
    hdr = ["W", "run", "step ms", "spread ms", "speedup", "loop ms", "loop speedup", "ideal"]
    rows = [[_w_label(r), r.a["run"], _f(r.a["step_ms"]), f"{_f(r.a['step_spread_ms'], 2)} {r.a['step_spread_kind']}",
             _f((r.a.get("speedup") or {}).get("projected_step"), 3, "x")
             + (" (noisy)" if (r.a.get("noise") or {}).get("noisy") else ""),
             _f(r.a["loop_ms"]), _f((r.a.get("speedup") or {}).get("loop"), 3, "x"), str(r.W)] for r in c.rows]
    out.append(("Step time and speedup vs W=1", hdr, rows))
    # equal work: a GPU's tokens/s and MFU (a simulated rank's with its collectives priced: summary.json `ranked`)
    hdr = ["W", "step ms", "tokens/s a GPU", "MFU (bf16 peak)", "peak GiB", "basis"]
    rows = []
    for r in c.rows:
        t = r.run.d.get("ranked") or {}
        tok, mfu, gib = t.get("tokens_per_s_per_gpu"), t.get("mfu"), (r.run.d.get("memory") or {}).get("allocated_gib")
        rows.append([_w_label(r), _f(t.get("step_ms")), "-" if tok is None else f"{tok:,.0f}",
                     "-" if mfu is None else f"{mfu:.1%}", "-" if gib is None else f"{gib:.1f}", t.get("basis", "-")])
    out.append(("Throughput at equal work", hdr, rows))
    hdr = ["W", "step speedup", "Amdahl (compute)", "isolated ops + rest/W", "residual ms", "residual is"]
    rows = []
    for r in c.rows:
        am = r.a.get("amdahl", {})
        res, named = am.get("residual") or {}, am.get("residual_named")
        rows.append([_w_label(r), _f((r.a.get("speedup") or {}).get("projected_step"), 3, "x"),
                     _f(am.get("predicted_speedup"), 3, "x"), _f(am.get("isolated_predicted_speedup"), 3, "x"),
                     _f(am.get("residual_ms")),
                     f"{named} ({', '.join(f'{k} {v:.3g}' for k, v in res.items())} ms)" if named else "-"])
    out.append(("Predicted speedups and the residual", hdr, rows))
    compute = [p for p in PARTS if p not in COMM_PARTS]
    hdr = ["W", *[PART_LABEL[p] for p in compute]]
    rows = [[str(r.W), *[f"{_f(r.a['parts_ms'][p])} ({_pct(r.a['shares'][p])})" for p in compute]] for r in c.rows]
    out.append(("Compute parts of the step, ms (share of the step)", hdr, rows))
    hdr = ["W", *[PART_LABEL[p] for p in COMM_PARTS], "idle source"]
    rows = [[str(r.W), *[f"{_f(r.a['parts_ms'][p])} ({_pct(r.a['shares'][p])})" for p in COMM_PARTS],
             r.a["idle_source"]] for r in c.rows]
    out.append(("Communication and idle parts of the step, ms (share of the step)", hdr, rows))
    hdr = ["W", *[f"{op} in-step" for op in OPS], "other compute"]
    rows = [[str(r.W), *[_f((r.a.get("speedup_instep") or {}).get(op), 3, "x") for op in OPS],
             _f((r.a.get("speedup_parts") or {}).get("other"), 3, "x")] for r in c.rows]
    out.append(("In-step speedups vs W=1 (summed over blocks)", hdr, rows))
    hdr = ["W", *[f"{op} isolated" for op in OPS]]
    rows = [[str(r.W), *[_f((r.a.get("speedup_isolated") or {}).get(op), 3, "x") for op in OPS]] for r in c.rows]
    out.append(("Isolated op speedups vs W=1 (per call, ops runs)", hdr, rows))
    hdr = ["W", *[f"{op} in-step" for op in OPS]]
    out.append(("In-step op time per call, ms", hdr, [[str(r.W), *[_f(r.a["call_ms"][op]) for op in OPS]]
                                                       for r in c.rows]))
    hdr = ["W", *[f"{op} isolated" for op in OPS]]
    out.append(("Isolated op time per call, ms (ops runs)", hdr,
                [[str(r.W), *[_f(r.a["isolated_call_ms"].get(op)) for op in OPS]] for r in c.rows]))
    if any(r.a["profile_call_ms"] for r in c.rows):  # kernel time inside the regions (--profile)
        hdr = ["W", *[f"{op} kernels" for op in OPS]]
        out.append(("Kernel time per call inside the op regions, ms (profiler)", hdr,
                    [[str(r.W), *[_f((r.a["profile_call_ms"] or {}).get(op)) for op in OPS]] for r in c.rows]))
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


def build_label(compile_key: str) -> str:
    """A configuration key's compile setting ("off", "default", "off + step graph") as the regimes say it."""
    mode, graph = compile_key.split(" + step graph")[0], " + step graph" if "step graph" in compile_key else ""
    return ("eager" if mode == "off" else f"compiled ({mode})") + graph


def _weights_short(c: Config) -> str:
    """The weights mode in a word, where the strategy label does not already say it."""
    if any(t in c.strategy for t in (" zero", " fsdp")) or c.strategy.startswith("tp"):
        return ""
    return c.key.get("weights", "ddp").upper()


def config_titles(configs: list[Config]) -> dict[str, str]:
    """Each configuration's section title: strategy, weights, compile, W range, and the harness and simulated ranks
    where they apply; where two would read the same, the settings they differ in (batch, blocks, heads, ...)."""
    def base(c: Config) -> str:
        ws = sorted({r.W for r in c.rows})
        strategy = c.strategy.replace(" simulated", "").replace(" bare", "")
        what = [strategy, _weights_short(c), build_label(c.key["compile"]),
                f"W={ws[0]}" if len(ws) == 1 else f"W={ws[0]}-{ws[-1]}"]
        what += ["bare loop"] if " bare" in c.strategy else []
        what += ["simulated ranks"] if c.strategy.endswith(" simulated") else []
        return ", ".join(w for w in what if w)

    titles = {c.id: base(c) for c in configs}
    for c in configs:
        twins = [o for o in configs if o is not c and titles[o.id].split(" [")[0] == base(c)]
        if twins:
            keys = [k for k in c.key if any(o.key.get(k) != c.key[k] for o in twins)]
            titles[c.id] = base(c) + " [" + ", ".join(f"{k} {c.key[k]}" for k in keys) + "]"
    return titles
