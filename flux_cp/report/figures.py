"""The report's PNGs: per configuration (breakdown per W, speedup vs W, op times per call), the
reconciliation (predicted speedup vs W with bounds, and the waterfall of the W=1 step at each W) and the regimes
(speedup vs W per W=1 baseline and work per step, the user's 1.66x marked).

Only data that exists is drawn: a part that is zero at every W has no legend entry, a configuration
without op timings has no ops figure (the report says so instead). Lines that can coincide get distinct
markers and dash styles so that neither hides the other.
"""

from pathlib import Path

from .reconcile import WATERFALL
from .regimes import TOLERANCE, USER_SPEEDUP
from .runs import OPS, PART_LABEL, PARTS

STYLES = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", (0, (5, 1))), ("P", (0, (3, 1, 1, 1)))]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return path


def config_figures(report, out: Path) -> dict[str, list[Path]]:
    plt = _plt()
    made: dict[str, list[Path]] = {}
    colors = dict(zip(PARTS, plt.get_cmap("tab10").colors))
    for c in report.configs:
        paths = made.setdefault(c.id, [])
        labels = [f"W={r.W}" + ("\nbase" if r.baseline else "") + ("\nsim" if r.a["simulated"] else "")
                  for r in c.rows]
        # 1. stacked time breakdown per W: parts that exist somewhere
        fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(c.rows) + 2.5), 3.6))
        bottom = [0.0] * len(c.rows)
        for p in PARTS:
            vals = [r.a["parts_ms"][p] or 0.0 for r in c.rows]
            if any(vals):
                ax.bar(labels, vals, bottom=bottom, label=PART_LABEL[p], color=colors[p])
                bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel(f"ms per step ({c.rows[0].a['timer']})")
        ax.set_title(f"{c.id}: step breakdown ({c.strategy})", fontsize=9)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
        paths.append(_save(fig, out / f"{c.id}_breakdown.png"))
        # 2. speedup vs W with the ideal line
        pts = [r for r in c.rows if "speedup" in r.a]
        if len(pts) > 1:
            fig, ax = plt.subplots(figsize=(5.5, 3.6))
            ws = [r.W for r in pts]
            ax.plot([1, max(ws)], [1, max(ws)], color="k", ls="--", lw=1, label="ideal")
            lines = [("step (measured)" if not any(r.a["simulated"] for r in pts) else "step (projected)",
                      [(r.W, r.a["speedup"]["projected_step"]) for r in pts]),
                     ("Amdahl (compute parts)", [(r.W, r.a["amdahl"]["predicted_speedup"]) for r in pts])]
            lines += [(f"{op} in-step", [(r.W, r.a["speedup_instep"][op]) for r in pts]) for op in OPS]
            for i, (lab, xy) in enumerate(lines):
                xy = [(w, s) for w, s in xy if s]
                if xy:
                    m, ls = STYLES[i % len(STYLES)]
                    ax.plot(*zip(*xy), marker=m, ls=ls, lw=2 if i == 0 else 1, ms=7 - i * 0.7, alpha=0.85, label=lab)
            b = [(r.W, r.a["speedup"]["projected_step"], *r.a["speedup"]["bounds"]) for r in pts
                 if r.a["simulated"] and r.a["speedup"]["bounds"][0]]
            if b:
                ax.errorbar([x[0] for x in b], [x[1] for x in b], capsize=4, ls="none", color="gray",
                            yerr=[[max(0, x[1] - x[2]) for x in b], [max(0, x[3] - x[1]) for x in b]],  # 0, not -2e-16
                            label="prediction bounds")
            ax.set_xlabel("W (effective world size)")
            ax.set_ylabel("speedup vs W=1")
            ax.set_xticks(sorted(set(ws)))
            ax.set_title(f"{c.id}: speedup ({c.strategy})", fontsize=9)
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
            paths.append(_save(fig, out / f"{c.id}_speedup.png"))
        # 3. op time per call, in-step vs isolated: one panel per op, bars by W (only what was measured)
        have = [op for op in OPS if any(r.a["call_ms"][op] or r.a["isolated_call_ms"].get(op) for r in c.rows)]
        if have:
            fig, axs = plt.subplots(1, len(have), figsize=(2.3 * len(have) + 1, 3.2), squeeze=False)
            iso = any(r.a["isolated_call_ms"] for r in c.rows)
            for ax, op in zip(axs[0], have):
                xs = range(len(c.rows))
                w = 0.4 if iso else 0.6
                ax.bar([x - (w / 2 if iso else 0) for x in xs], [r.a["call_ms"][op] or 0 for r in c.rows], w,
                       color="tab:blue", label="in-step")
                if iso:
                    ax.bar([x + w / 2 for x in xs], [r.a["isolated_call_ms"].get(op, 0) for r in c.rows], w,
                           color="tab:orange", label="isolated")
                ax.set_xticks(list(xs))
                ax.set_xticklabels([f"W={r.W}" for r in c.rows], fontsize=8)
                ax.set_title(op, fontsize=9)
            axs[0][0].set_ylabel("ms per call")
            axs[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
            fig.suptitle(f"{c.id}: op time per call" + ("" if iso else " (no ops runs: in-step only)"), fontsize=9)
            paths.append(_save(fig, out / f"{c.id}_ops.png"))
    return made


def reconcile_figure(rec: dict | None, out: Path) -> list[Path]:
    """Left: predicted speedup vs W with bounds, measured points, the user's 1.66x, alternatives.
    Right: the waterfall of the W=1 step at each W."""
    if not rec or not rec["rows"]:
        return []
    plt = _plt()
    rows = rec["rows"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.3]})
    ws = [r["W"] for r in rows]
    top = max(ws)
    ax.plot([1, top], [1, top], color="k", ls="--", lw=1, label="ideal")
    simulated = [r["basis"].startswith("simulated") for r in rows]
    basis = "predicted" if all(simulated) else "measured" if not any(simulated) else "predicted or measured"
    ax.plot([1, *ws], [1, *[r["predicted_speedup"] for r in rows]], marker="o", lw=2,
            label=f"{rec['strategy']} {basis}")
    noisy = [(r["W"], r["predicted_speedup"]) for r in rows if r.get("noisy")]
    if noisy:  # the step spread exceeds the difference the point shows
        ax.plot(*zip(*noisy), ls="none", marker="o", ms=13, mfc="none", mec="tab:orange", mew=1.5,
                label="noisy: spread > difference")
    # nothing overlapped .. everything overlapped, as error bars where they have a width (one W has no area to fill)
    b = [(r["W"], r["predicted_speedup"], *r["bounds"]) for r in rows if r["bounds"][0] and
         r["bounds"][1] - r["bounds"][0] > 1e-3]
    if b:
        ax.errorbar([x[0] for x in b], [x[1] for x in b], yerr=[[x[1] - x[2] for x in b], [x[3] - x[1] for x in b]],
                    ls="none", capsize=5, color="tab:blue", label="bounds (none .. all overlapped)")
    meas = [(r["W"], r["measured_speedup"]) for r in rows if "measured_speedup" in r]
    if meas:
        ax.plot(*zip(*meas), ls="none", marker="x", ms=10, mew=2, color="tab:red", label="measured (real processes)")
    if rec.get("user_settings"):  # the user's figure only beside the user's settings
        ax.plot([2], [rec["user_speedup"]], ls="none", marker="*", ms=14, color="gold", mec="k",
                label=f"user's {rec['user_speedup']}x")
    best: dict[str, list] = {}
    for a in rec["alternatives"]:
        best.setdefault(f"{a['strategy']}, compile {a['compile']}", []).append((a["W"], a["speedup"]))
    for i, (lab, xy) in enumerate(sorted(best.items())[:6]):
        m, ls = STYLES[(i + 1) % len(STYLES)]
        ax.plot(*zip(*sorted(xy)), marker=m, ls=ls, lw=1, alpha=0.8, label=lab)
    ax.set_xticks(sorted({1, *ws, *[a["W"] for a in rec["alternatives"]]}))
    ax.set_xlabel("W")
    ax.set_ylabel(f"speedup vs the W=1 step ({(rec.get('baseline') or {}).get('kind', 'plain W=1')})")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"speedup vs W ({basis})", fontsize=9)
    # waterfall: each W a group of floating bars from 0 to the ideal, then each loss, ending at the prediction
    colors = dict(zip(WATERFALL, plt.get_cmap("tab10").colors))
    parts = [k for k in WATERFALL if any(abs(r["waterfall_ms"][k]) > 1e-9 for r in rows)]  # e.g. no idle on CPU
    width = 0.8 / len(parts)
    peak = rec["baseline_ms"]
    # a real run whose K/V exchange is neither profiled nor priced: its waits are in the attention bar
    names = {WATERFALL[1]: f"{WATERFALL[1]} + K/V waits (not split)"} if any(r.get("kv_unsplit") for r in rows) else {}
    for i, r in enumerate(rows):
        run = 0.0
        for j, k in enumerate(parts):
            v = r["waterfall_ms"][k]
            x = i + (j - len(parts) / 2 + 0.5) * width
            bx.bar(x, v, width, bottom=run if j else 0.0, color=colors[k], label=names.get(k, k) if i == 0 else None)
            run += v
            peak = max(peak, run, run - v)
        bx.hlines(run, i - 0.4, i + 0.4, colors="k", lw=1.5, label="predicted step" if i == 0 else None)
        bx.annotate(f"{run:.3g}", (i + 0.4, run), fontsize=7, va="bottom", ha="right")
    bx.set_ylim(0, 1.1 * peak)  # floating bars do not widen the axes by themselves: every bar top in view
    bx.axhline(rec["baseline_ms"], color="gray", ls=":", lw=1, label="W=1 step")
    bx.set_xticks(range(len(rows)))
    bx.set_xticklabels([f"W={r['W']}" for r in rows])
    bx.set_ylabel(f"ms per step ({rows[0]['timer']})")
    bx.set_title("where the W=1 step's time goes at each W", fontsize=9)
    bx.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    return [_save(fig, out / "reconcile.png")]


def regimes_figure(reg: dict | None, out: Path) -> list[Path]:
    """Speedup vs W, one line per regime (its own W=1 baseline = 1 at W=1), prediction bounds as error bars, the
    user's 1.66x at W=2 with its +-10% band."""
    summary = (reg or {}).get("summary") or {}
    if not summary:
        return []
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.0, 4.0 + 0.16 * len(summary)))
    ws = sorted({int(w) for s in summary.values() for w in s["speedups"]})
    top = max([USER_SPEEDUP * (1 + TOLERANCE), *[b for s in summary.values() for bs in s["bounds"].values()
                                                for b in bs if b is not None],
               *[v for s in summary.values() for v in s["speedups"].values() if v]])
    ax.set_ylim(0, 1.15 * top)  # the ideal line is clipped: the regimes' own range, not W's, sets the scale
    ax.plot([1, max(ws)], [1, max(ws)], color="k", ls="--", lw=1, label="ideal")
    colors = plt.get_cmap("tab10").colors
    some = any(s["verdict"] == "reproduces" for s in summary.values())
    for i, (rid, s) in enumerate(summary.items()):
        pts = sorted((int(w), v) for w, v in s["speedups"].items() if v)
        m, ls = STYLES[i % len(STYLES)]
        color = colors[i % len(colors)]
        hit = s["verdict"] == "reproduces"  # drawn over the others, which fade where some regime reproduces
        ax.plot([1, *[w for w, _ in pts]], [1.0, *[v for _, v in pts]], marker=m, ls=ls, lw=2.8 if hit else 1.5,
                ms=7 if hit else 5, alpha=0.95 if hit or not some else 0.35, zorder=4 if hit else 2,
                color=color, label=f"{i + 1}. {rid} ({s['verdict']})")
        b = [(w, v, *s["bounds"][str(w)]) for w, v in pts if s["bounds"][str(w)][0] is not None]
        if b:
            ax.errorbar([x[0] for x in b], [x[1] for x in b], yerr=[[x[1] - x[2] for x in b],
                        [x[3] - x[1] for x in b]], ls="none", capsize=3, color=color, alpha=0.7)
    ax.errorbar([2], [USER_SPEEDUP], yerr=[[USER_SPEEDUP * TOLERANCE], [USER_SPEEDUP * TOLERANCE]], ls="none",
                marker="*", ms=15, color="gold", mec="k", ecolor="goldenrod", capsize=6, zorder=5,
                label=f"user's {USER_SPEEDUP}x at W=2 (+-{TOLERANCE:.0%})")
    ax.set_xticks(sorted({1, *ws}))
    ax.set_xlabel("W")
    ax.set_ylabel("speedup vs the regime's W=1 baseline")
    ax.set_title("regimes: which W=1 baseline and which work per step give 1.66x", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    return [_save(fig, out / "regimes.png")]
