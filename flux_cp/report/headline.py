"""The report's opening: the verdicts, from the sections below them and in their words.

The user's 1.66x: the regime table's verdict (regimes.py), naming one regime: the first that reproduces it, else the
closest at W=2, else none and why. What pays and what to run: at each W the fastest configuration run in that
regime's device, model, data, host and harness, against the regime's W=1 step (the regime table's "what to run"),
with the command that runs it; without a regime, the fastest analysed configuration at each W against its own W=1
step. Every figure here is one a section below prints: the opening adds no number of its own.
"""

from flux_cp.config import RUN_GROUPS, RunConfig

from .reconcile import RING, USER_SPEEDUP
from .regimes import BEYOND, TOLERANCE, recipe_for
from .tables import build_label

PAYS, EVEN = 1.1, 0.9  # a speedup at or above PAYS pays; between EVEN and PAYS it breaks about even
COMMAND = "python scripts/train_bench.py"
# run settings a command names (where they differ from the defaults): the strategy's and the build's
FLAGS = tuple(k for k in (*RUN_GROUPS["Parallelism"], "precision", "micro_batches", *RUN_GROUPS["Compile"])
              if k not in ("cp", "simulate_world", "simulate_rank", "cp_degree"))
_DEFAULT = RunConfig()


def pays(speedup: float) -> str:
    return "pays" if speedup >= PAYS else "breaks about even" if speedup >= EVEN else "does not pay"


def _flag(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def command(d: dict, W: int) -> str:
    """The command that runs a configuration on W GPUs: its recipe (configs/recipes) where its settings are one's,
    else its strategy's and build's settings as flags; the batch where it is not 1."""
    run = d["config"]["run"]
    if recipe := recipe_for(run):
        args = [f"--config {recipe}"]
    else:
        args = [f"--cp {d['cp']}"] + [f"--{k.replace('_', '-')} {_flag(run[k])}" for k in FLAGS
                                      if k in run and run[k] != getattr(_DEFAULT, k, None)]
    if (batch := d["config"]["data"]["batch_size"]) != 1:
        args.append(f"--data.batch_size {batch}")
    return f"{COMMAND} {' '.join(args)} --devices {W}"


def _readable(strategy: str) -> str:
    """A strategy label without the bookkeeping marks (simulated rank, bare loop): what a user would run."""
    return strategy.replace(" simulated", "").replace(" bare", "")


def headline(report) -> dict:
    """{"source": "regimes" | "configurations" | None, ...}: report.json's `headline`, report.md's opening."""
    reg = report.regimes or {}
    summary, rid = reg.get("summary") or {}, reg.get("headline")
    by_path = {str(r.path): r for r in report.runs}
    if rid is None:
        return _from_configs(report, by_path)
    s = summary[rid]
    numbers = {k: i for i, k in enumerate(summary, 1)}
    counts: dict[str, int] = {}
    for x in summary.values():
        counts[x["verdict"]] = counts.get(x["verdict"], 0) + 1
    same = ("batch", "depth", "compile", "lightning_sync", "host", "device")
    ring = [k for k, x in summary.items() if x["baseline"]["kind"] == RING and all(x[f] == s[f] for f in same)]
    best = {}
    for w, b in (s.get("best") or {}).items():
        run = by_path.get(b["path"])
        best[w] = {**b, "strategy": _readable(b["strategy"]), "pays": pays(b["speedup"]),
                   "command": command(run.d, int(w)) if run else None,
                   "users_speedup": s["speedups"].get(w)}
    return {"source": "regimes", "regime": rid, "number": numbers[rid], "why": reg.get("headline_kind"),
            "verdict": s["verdict"], "reason": s["reason"], "mechanism": s["mechanism"], "speedups": s["speedups"],
            "bounds": s["bounds"], "basis": s["basis"], "baseline": s["baseline"], "counts": counts,
            "host_axis": (s.get("host_axis") or {}).get("statement"),
            "reproducing": [{"regime": k, "number": numbers[k]} for k, x in summary.items()
                            if x["verdict"] == "reproduces" and k != rid],
            "users_w1": [{"regime": k, "number": numbers[k], "speedups": summary[k]["speedups"],
                          "verdict": summary[k]["verdict"]} for k in ring if k != rid],
            "best": best}


def _from_configs(report, by_path: dict) -> dict:
    """No regime: the fastest analysed configuration at each W, each against its own W=1 step."""
    reg = report.regimes or {}
    why = ("no W >= 2 run of the user's configuration (torch's ring, allgather rotation, DDP, bf16, 4608 tokens) "
           + ("has a W=1 baseline of its settings" if reg.get("unpaired") else "among the runs"))
    best: dict[str, dict] = {}
    for c in report.configs:
        if c.baseline is None:
            continue
        b = c.baseline.a
        for r in c.rows:
            sp = (r.a.get("speedup") or {}).get("projected_step")
            if r.W < 2 or not sp or (str(r.W) in best and best[str(r.W)]["speedup"] >= sp):
                continue
            best[str(r.W)] = {"W": r.W, "strategy": _readable(c.strategy), "compile": build_label(c.key["compile"]),
                              "config": c.id, "run": r.a["run"], "path": r.a["path"], "speedup": sp,
                              "basis": "predicted" if r.a["collectives"] == "fake" else "measured",
                              "noisy": r.a["noise"]["noisy"], "peak_gib": r.a.get("peak_gib"),
                              "pays": "not conclusive: noisy" if r.a["noise"]["noisy"] else pays(sp),
                              "baseline": {"run": b["run"], "step_ms": b["step_ms"], "cp": b["cp"]},
                              "command": command(by_path[r.a["path"]].d, r.W) if r.a["path"] in by_path else None}
    return {"source": "configurations" if best else None, "regime": None, "why": why,
            "best": dict(sorted(best.items(), key=lambda x: int(x[0])))}


def _cell(h: dict, w: str) -> str:
    lo, hi = h["bounds"].get(w) or (None, None)
    return (f"{h['speedups'][w]:.2f}x at W={w} ({h['basis'][w]}"
            + (f", bounds {lo:.2f}-{hi:.2f}" if lo is not None and hi is not None else "") + ")")


def headline_md(report) -> list[str]:
    """The opening section: the 1.66x, why, what pays and what to run, each pointing at the section it comes from."""
    h = report.headline or {}
    out = ["## Verdict", ""]
    band = f"{USER_SPEEDUP * (1 - TOLERANCE):.3g}-{USER_SPEEDUP * (1 + TOLERANCE):.3g}x"
    if h.get("source") == "regimes":
        n, b = h["number"], h["baseline"]
        sp = ", ".join(_cell(h, w) for w in h["speedups"])
        counted = ", ".join(f"{v} {k}" for k, v in h["counts"].items())
        lead = {"reproduces": f"**reproduced by regime {n}**",
                "closest": f"**not reproduced by any regime** ({counted}); the closest at W=2 is regime {n}",
                "incomplete": f"**not tested**: no regime has a W=2 run ({counted}); regime {n}"}[h["why"]]
        out.append(f"- **The user's {USER_SPEEDUP}x at W=2**: {lead} of the [regime table](#regimes) "
                   f"({h['regime']}): against its W=1 step, {b['kind']} ({b['run']}, {b['step_ms']:.3g} ms), the "
                   f"user's ring gives {sp}. {h['verdict'].capitalize()}: {h['reason']} (reproducing means W=2 in "
                   f"{band} and no larger W at {BEYOND:g}x the W=2 speedup or more).")
        if h["reproducing"]:
            out.append("  Also reproduced by regime" + ("s " if len(h["reproducing"]) > 1 else " ")
                       + ", ".join(f"{x['number']} ({x['regime']})" for x in h["reproducing"]) + ".")
        for u in h["users_w1"]:  # the user's own W=1 step (the seed's --nproc-per-node 1), same work per step
            out.append(f"  With the user's own W=1 step ({RING}, regime {u['number']}): "
                       + ", ".join(f"{v:.2f}x at W={w}" for w, v in u["speedups"].items()) + f": {u['verdict']}.")
        out.append(f"- **Why** (regime {n}, the [reconciliation](#reconcile) decomposes it): "
                   f"{h['mechanism']}.")
        if h.get("host_axis"):  # h: the host's time per op over the regime's W=2 run's (report/host_axis.py)
            out.append(f"- **On other hosts** (regime {n}, the regime table's host axis): {h['host_axis']}.")
        against = f"regime {n}'s W=1 step ({b['kind']}, {b['step_ms']:.3g} ms)"
        scope = f"the fastest configuration run on regime {n}'s device, model, data, host and harness"
    elif h.get("source") == "configurations":
        out.append(f"- **The user's {USER_SPEEDUP}x at W=2**: not tested: {h['why']} (the regime table needs one).")
        against, scope = "its own W=1 step", "the fastest configuration among the runs"
    else:
        return out + [f"- **The user's {USER_SPEEDUP}x at W=2**: not tested: {h.get('why', 'no runs')}.",
                      "- **What pays**: nothing to judge: no configuration has a W=1 baseline and a W > 1 run.", ""]
    if not h["best"]:
        return out + [f"- **What pays and what to run**: no other configuration was run against {against}.", ""]
    out.append(f"- **What pays and what to run** ({scope}, against {against}; pays: {PAYS:g}x or more):")
    for w, b in h["best"].items():
        base = (f", against {b['baseline']['run']} ({b['baseline']['step_ms']:.3g} ms)" if "baseline" in b else "")
        mine = ("; the user's own configuration" if b.get("users") else f"; the user's ring {b['users_speedup']:.2f}x"
                if b.get("users_speedup") is not None else "")
        mem = f", peak {b['peak_gib']:.3g} GiB per rank" if b.get("peak_gib") is not None else ""
        cmd = f": `{b['command']}`" if b.get("command") else ""
        out.append(f"  - W={w}: {b['strategy']}, {b['compile']}: {b['speedup']:.2f}x ({b['basis']}"
                   f"{base}{mem}{mine}): **{b['pays']}**{cmd}")
    return out + [""]
