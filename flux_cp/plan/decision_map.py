"""The decision map: for each cell (sequence length S, global batch B, W GPUs) the best plan, the runner-up and plain
data parallelism's best beside them, from the cells' plan.json files (scripts/plan.py), as a table and a figure with
one panel per S.

    rows = load_map(Path("runs/plan_map/map"))       # every <cell>/plan.json under it (or *.plan.json files)
    print(render_markdown(rows)); draw(rows, Path("map.png"))
"""

import json
import re
from pathlib import Path

CELL = re.compile(r"S(\d+)-B(\d+)-W(\d+)")


def _brief(r: dict | None) -> dict | None:
    if r is None:
        return None
    return {k: r.get(k) for k in ("plan", "step_ms", "tokens_per_s_per_gpu", "mfu", "peak_gib", "basis", "command")}


class MapError(ValueError):
    """A plan.json under the map's folder that cannot be read: its path and why, in one line."""


def load_map(root: Path) -> list[dict]:
    """One row per cell found under root, sorted by S, W, B; each with its best, runner-up and plain-DP plans
    (`source`: its plan.json, relative to root). A plan.json that cannot be read raises MapError."""
    files = sorted(set(Path(root).glob("*/plan.json")) | set(Path(root).glob("*.plan.json")))
    rows = []
    for f in files:
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise MapError(f"{f}: unreadable ({getattr(e, 'strerror', None) or str(e).splitlines()[0]})") from None
        if not isinstance(d, dict) or not isinstance(d.get("plans"), list):
            raise MapError(f"{f}: not a plan.json of scripts/plan.py (no `plans` list)")
        m = CELL.fullmatch(str(d.get("cell", "")))
        if not m:
            continue
        s = d.get("summary") or {}
        ran = [r for r in d["plans"] if r["status"] == "ran"]
        failed = sum(r["status"] not in ("ran", "pruned", "over memory") for r in d["plans"])
        S, B, W = map(int, m.groups())
        why = [str(r.get("why") or "") for r in d["plans"] if r["status"] == "pruned"]
        fit = sum(w.startswith("not measured") for w in why)  # plans that fit on paper, none of them run
        none = (None if ran else f"not measured; {fit} plan{'' if fit == 1 else 's'} fit" if fit
                else "no plan fits a GPU's memory" if any(w.startswith("does not fit") for w in why) else "none ran")
        rows.append({"cell": d["cell"], "S": S, "B": B, "W": W, "device": d.get("device"), "link": d.get("link"),
                     "plans_ran": len(ran), "plans_failed": failed,
                     "best": _brief(s.get("best")), "runner_up": _brief(s.get("runner_up")),
                     "data_parallel": _brief(s.get("data_parallel")), "best_over_dp": s.get("best_over_dp"),
                     "none_because": none, "source": str(f.relative_to(root))})
    return sorted(rows, key=lambda r: (r["S"], r["W"], r["B"]))


def _fmt(r: dict | None, with_plan: bool = True) -> str:
    if r is None:
        return "-"
    mfu = "" if r.get("mfu") is None else f", {r['mfu']:.0%}"
    head = f"{r['plan']}: " if with_plan else ""
    return f"{head}{r['tokens_per_s_per_gpu']:,.0f}{mfu}"


def render_markdown(rows: list[dict]) -> str:
    """The map as one table: tokens/s a GPU and MFU of the best plan, the runner-up and plain DP in each cell."""
    out = ["| S | B | W | best plan: tokens/s a GPU, MFU | step ms | runner-up | plain DP | best / DP |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, dp = r["best"], r["data_parallel"]
        same = dp is not None and b is not None and dp["plan"] == b["plan"]
        best = _fmt(b) if b is not None else f"- ({r['none_because']})" if r.get("none_because") else "-"
        out.append(f"| {r['S']} | {r['B']} | {r['W']} | {'**' if same else ''}{best}{'**' if same else ''} | "
                   f"{'-' if b is None else format(b['step_ms'], '.4g')} | {_fmt(r['runner_up'])} | "
                   f"{'(best)' if same else _fmt(dp)} | "
                   f"{'-' if r['best_over_dp'] is None else format(r['best_over_dp'], '.2f') + 'x'} |")
    return "\n".join(out)


def draw(rows: list[dict], path: Path, title: str = "") -> Path:
    """One panel per S: tokens/s a GPU against W, the best plan (solid) and plain DP (dashed) for each batch kind
    (B = 1, B = W, B = 4W); a point is missing where no plan of that kind ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seqs = sorted({r["S"] for r in rows})
    fig, axes = plt.subplots(1, len(seqs), figsize=(4.2 * len(seqs), 3.6), squeeze=False)
    kinds = {"B = 1": lambda r: r["B"] == 1, "B = W": lambda r: r["B"] == r["W"] and r["W"] > 1,
             "B = 4W": lambda r: r["B"] == 4 * r["W"]}
    for ax, S in zip(axes[0], seqs):
        for (label, pick), color in zip(kinds.items(), ("C0", "C1", "C2")):
            cells = sorted((r for r in rows if r["S"] == S and (pick(r) or (r["W"] == 1 and r["B"] == 1
                                                                           and label != "B = 4W"))),
                           key=lambda r: r["W"])
            best = [(r["W"], r["best"]["tokens_per_s_per_gpu"]) for r in cells if r["best"]]
            dp = [(r["W"], r["data_parallel"]["tokens_per_s_per_gpu"]) for r in cells if r["data_parallel"]]
            if best:
                ax.plot(*zip(*best), "o-", color=color, label=f"{label}: best")
            if dp and label != "B = 1":
                ax.plot(*zip(*dp), "s--", color=color, alpha=0.6, label=f"{label}: plain DP")
        ax.set_ylim(bottom=0)  # tokens/s a GPU from zero: equal work compares at equal heights
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
        ax.set_xlabel("W (GPUs)")
        ax.set_title(f"S = {S} tokens")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("tokens/s a GPU")
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
