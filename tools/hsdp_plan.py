"""HSDP (shard inside a node of 8, replicate across nodes) against plain FSDP over every rank, for n nodes x 8 GPUs,
priced on paper from one simulated rank of an FSDP run at W = 8 and a two-tier link profile.

    python tools/hsdp_plan.py RUN_DIR [--nodes 2,4,8] [--intra h200-nvlink4] [--inter ib-ndr] [--json]

RUN_DIR: a run of `scripts/train_bench.py --weights fsdp --simulate-world 8` (its summary.json and ledger). Inside a
node both plans run the W = 8 rank's all-gathers and reduce-scatters; HSDP adds an all-reduce of each rank's 1/8
of the gradients over the n nodes (hidden under the backward where it can be), plain FSDP runs every all-gather and
reduce-scatter over all 8n ranks on the inter-node link. The model and its assumptions: predict/hsdp.py's docstring.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flux_cp.predict import hsdp  # noqa: E402
from flux_cp.predict.links import LINKS_DIR, load  # noqa: E402
from flux_cp.runs.throughput import throughput_of  # noqa: E402

PROG = "hsdp_plan.py"


def _nodes(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or any(n < 1 for n in out):
        raise ValueError(f"--nodes {text}: need node counts >= 1, comma-separated (e.g. --nodes 2,4,8)")
    return out


def _profile(flag: str, name: str):
    try:
        return load(name)
    except (OSError, ValueError, KeyError, TypeError) as e:
        known = ", ".join(sorted(p.stem for p in LINKS_DIR.glob("*.yaml")))
        raise ValueError(f"{flag} {name}: not a link profile ({type(e).__name__}); pass one of {known} "
                         "(configs/links/) or a YAML path") from None


def _run(folder: Path) -> dict:
    try:
        return json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        raise ValueError(f"RUN_DIR {folder}: no readable summary.json there (pass the --output folder of a "
                         "train_bench.py --weights fsdp --simulate-world 8 run)") from None


def _table(d: dict, plans: list[hsdp.NodePlan], tiers: hsdp.TwoTier) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{d.get('run_name', 'run')}: HSDP (8 a node, replicas across nodes) vs FSDP over all ranks, "
              f"priced on {tiers.intra.name} inside a node and {tiers.inter.name} across")
    for col in ("nodes", "W", "plan", "step ms", "exposed comm ms", "tokens/s a GPU", "MFU", "cross-node GB/step/rank",
                "HSDP saves"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for p in plans:
        for name, r in (("HSDP", p.hsdp), ("FSDP", p.fsdp)):
            t.add_row(str(p.nodes), str(p.world), name, f"{r.step_ms:.2f}", f"{r.exposed_comm_ms:.2f}",
                      "-" if r.tokens_per_s_per_gpu is None else f"{r.tokens_per_s_per_gpu:,.0f}",
                      "-" if r.mfu is None else f"{r.mfu:.1%}", f"{r.cross_node_bytes / 1e9:.3g}",
                      f"{p.saved_ms:.2f} ms ({p.saved_ms / p.fsdp.step_ms:.0%})" if name == "HSDP" else "")
    Console(width=max(120, Console().width)).print(t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a simulated W=8 FSDP run's --output folder")
    p.add_argument("--nodes", default="2,4,8", help="node counts n (8 GPUs each), comma-separated")
    p.add_argument("--intra", default="h200-nvlink4", help="inside a node: a profile of configs/links/ or a YAML")
    p.add_argument("--inter", default="ib-ndr", help="across nodes: a profile of configs/links/ or a YAML")
    p.add_argument("--json", action="store_true", help="print the plans as JSON instead of a table")
    a = p.parse_args(argv)
    try:
        nodes = _nodes(a.nodes)
        tiers = hsdp.TwoTier(_profile("--intra", a.intra), _profile("--inter", a.inter))
        d = _run(a.run_dir)
        hsdp.check_run(d)
        plans = hsdp.plan(d, d["comm"]["ledger"], tiers, nodes, work=throughput_of(d))
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"run": str(a.run_dir), "intra": tiers.intra.name, "inter": tiers.inter.name,
                          "plans": [p.to_dict() for p in plans]}, indent=1))
    else:
        _table(d, plans, tiers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
