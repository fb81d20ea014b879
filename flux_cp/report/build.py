"""The report built from a folder of runs: discover, group, analyse each configuration, then the sections that read
across them (reconciling the 1.66x, the harness's cost, the regimes, the levers)."""

from pathlib import Path

from flux_cp.predict import links

from .analysis import Report, analyse, borrow_ledgers
from .efficiency import efficiency
from .harness import harness_overhead
from .headline import headline
from .host_axis import host_axis
from .levers import levers
from .reconcile import reconcile
from .regimes import regimes
from .runs import ReportError, Skipped, _first_line, discover, group, isolated_rows


def build(root: Path, link=None, cpu_link=None,
          user: str = "torch(allgather)", across: tuple[str, ...] = ()) -> Report:
    """Discover, group, analyse; then the sections that read across configurations: the regimes first, the verdict
    and the reconciliation from them (the user's strategy: `user`), the harness's cost, the levers."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"RUNS_DIR {root}: not a directory (give the folder holding the runs' summary.json)")
    link = link or links.load("h200-nvlink4")
    runs, skipped = discover(root)
    if not runs and not skipped:
        raise ReportError(f"RUNS_DIR {root}: no summary.json found (run scripts/train_bench.py --output {root}/<name>)")
    borrow_ledgers(runs)
    iso = isolated_rows(runs)
    configs = []
    for c in group(runs, across):  # across: settings whose runs share configurations (--across)
        try:
            analyse(c, iso, link, cpu_link)
            configs.append(c)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:  # odd values: listed, never a crash
            why = f"could not analyse configuration {c.title} ({type(e).__name__}: {_first_line(e)})"
            skipped += [Skipped(r.run.path, "skipped", why) for r in c.rows]
    rep = Report(root, link, cpu_link, configs, runs, skipped, iso)
    rep.across = tuple(across)
    rep.regimes = regimes(rep)  # first: the headline and the reconciliation speak with its figures
    host_axis(rep)  # each regime's speedups as a function of the host's speed
    rep.headline = headline(rep)
    rep.reconcile = reconcile(rep, user)
    rep.harness = harness_overhead(configs, runs)
    rep.levers = levers(rep)
    rep.plans = _plans(root)
    rep.efficiency = efficiency(runs)
    return rep


def _plans(root: Path) -> list[dict]:
    """Each planner cell under the root (scripts/plan.py's plan.json): its cell, link, and ranked plans with tokens/s
    a GPU and MFU, as the planner wrote them."""
    import json

    out = []
    for f in sorted(root.rglob("plan.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and "plans" in d:
            out.append({"path": str(f.relative_to(root)), **d})
    return out
