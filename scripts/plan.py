"""For my batch, sequence length and GPUs, what trains fastest? Every plan of W GPUs ranked in tokens/s a GPU and MFU,
plain data parallelism among them (the baseline to beat).

    python scripts/plan.py --config configs/flux_4608.yaml --seq-len 4608 --global-batch 8 --world 8   # one GPU
    python scripts/plan.py --global-batch 2 --world 2 --builds eager          # no GPU: the tiny model on the CPU
    python scripts/plan.py ... --dry-run                                     # the plans and why some are left out
    python scripts/plan.py --cells "4608:1:1 4608:8:8 65536:1:8" --output map   # cells S:B:W in one process, + map
    python scripts/plan.py --map runs/plan_map/map       # the decision map of the cells under it: map.md, map.png

Each plan runs in this process as rank 0 of its W-rank job over torch's fake process group (the real code with a
rank's shapes; collectives move nothing and are recorded), then its collectives are priced with --link and placed on
its step as scripts/report.py does. W >= 2 figures are therefore a simulated rank with priced links, not a measured
W-GPU job. Writes <output>/plan.json (`plans`: every row, ranked) and <output>/<plan>/summary.json per run.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from flux_cp.config import ConfigError, parse_config  # noqa: E402
from flux_cp.runs.failures import EXIT_CONFIG  # noqa: E402


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"plan.py: error: {message} (see --help)", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


def main(argv: list[str] | None = None) -> int:
    from flux_cp.measure.timing import deepen_launch_queue

    deepen_launch_queue()  # before CUDA starts (in-process runs share its context): the idle probe must not stall
    p = _Parser(prog="plan.py", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="model config (default: configs/flux_4608.yaml on a GPU, "
                   "configs/tiny.yaml without one)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens a sample, image + text (default: the config's)")
    p.add_argument("--global-batch", type=int, help="samples an optimizer step, over all GPUs (required)")
    p.add_argument("--world", type=int, help="GPUs (W) (required)")
    p.add_argument("--cells", default=None, metavar="S:B:W ...", help="several cells (sequence length, global "
                   "batch, GPUs), space-separated, run one after another in this process (imports and the CUDA "
                   "context once): each into <output>/S<S>-B<B>-W<W>/, then the decision map of them all")
    p.add_argument("--builds", default="eager", help="eager and/or graph, comma-separated (graph: compiled per block, "
                   "the step replayed from one CUDA graph; GPU only; each compiles for ~30-60 s). Default: eager (a "
                   "cell of ~30 plans in ~3 minutes of an H100)")
    p.add_argument("--cp", default=None, help="strategies within a group, comma-separated (default: all that apply)")
    p.add_argument("--weights", default="ddp,zero2,zero2f,fsdp", help="weights modes, comma-separated (zero2f: ZeRO-2 "
                   "gathering its parameters under the next forward)")
    p.add_argument("--only", default=None, metavar="PLAN,...", help="run only these plans (names as the table "
                   "gives them, e.g. dp8-zero2-eager; with --cells, each cell runs those it has); the others are "
                   "listed as left out")
    p.add_argument("--memory-gib", type=float, default=None,
                   help="a GPU's memory (default: this GPU's; none on the CPU): plans estimated above it are pruned")
    p.add_argument("--link", default="h200-nvlink4", help="link profile the collectives are priced with")
    p.add_argument("--steps", type=int, default=12, help="measured steps a plan")
    p.add_argument("--warmup-steps", type=int, default=4, help="warm-up steps a plan (graph builds: at least 12)")
    p.add_argument("--output", type=Path, default=None, help="default: plans/<cell>-<time>")
    p.add_argument("--dry-run", action="store_true", help="list the plans and why some are left out; run nothing")
    p.add_argument("--map", type=Path, default=None, metavar="DIR", help="run nothing: the decision map of the "
                   "cells' plan.json files under DIR (the best plan, runner-up and plain DP a cell) -> DIR/map.md, "
                   "map.json, map.png")
    a = p.parse_args(argv)
    if a.map is not None:
        return _map(a.map)
    if a.cells is None and (a.global_batch is None or a.world is None):
        p.error("--global-batch and --world are required (or --cells S:B:W ..., or --map DIR)")
    if a.cells is not None and (a.global_batch or a.world or a.seq_len):
        p.error("--cells names each cell's S, B and W: drop --seq-len, --global-batch and --world")

    import torch
    from rich.console import Console

    from flux_cp.plan.plans import CP_KINDS, WEIGHTS, enumerate_plans
    from flux_cp.predict import links

    console = Console(stderr=True)
    cuda = torch.cuda.is_available()
    try:
        if a.cells is None and (a.world < 1 or a.global_batch < 1):
            raise ConfigError(f"--world {a.world} --global-batch {a.global_batch}: both must be >= 1")
        cells = _cells(a.cells) if a.cells is not None else [(a.seq_len, a.global_batch, a.world)]
        builds = tuple(a.builds.split(","))
        if bad := [b for b in builds if b not in ("eager", "graph")]:
            raise ConfigError(f"--builds {a.builds}: {', '.join(bad)} unknown (eager, graph)")
        if "graph" in builds and not cuda:
            raise ConfigError(f"--builds {a.builds}: the step graph needs a GPU (use --builds eager here)")
        cps = tuple(a.cp.split(",")) if a.cp else CP_KINDS
        weights = tuple(a.weights.split(","))
        if bad := [c for c in cps if c not in CP_KINDS] + [w for w in weights if w not in WEIGHTS]:
            raise ConfigError(f"--cp/--weights: {', '.join(bad)} unknown (cp: {', '.join(CP_KINDS)}; weights: "
                              f"{', '.join(WEIGHTS)})")
        base = (["--config", a.config] if a.config else []) + ["--steps", str(a.steps), "--warmup-steps",
                                                               str(a.warmup_steps), "--wandb-mode", "disabled"]
        cfg = parse_config(base, cuda_available=cuda)
        mem = a.memory_gib if a.memory_gib is not None else (
            torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None)
        link = links.load_any(a.link)
        cells = [(S or cfg.data.seq_len, B, W) for S, B, W in cells]
        # every cell's plans before any runs: a bad cell is refused before the first plan's minutes go
        planned = [(S, B, W, enumerate_plans(cfg, S, B, W, builds=builds, cps=cps, weights=weights,
                                             memory_gib_limit=mem, on_gpu=cuda)) for S, B, W in cells]
        # --only over --cells: each cell runs the named plans it has; a name no cell has is refused up front
        if a.only and (unknown := set(a.only.split(",")) - {q.name for *_, ps in planned for q in ps}):
            where = f"S{cells[0][0]}-B{cells[0][1]}-W{cells[0][2]}" if len(cells) == 1 else "any cell"
            raise ConfigError(f"--only {', '.join(sorted(unknown))}: no such plan in {where} (--dry-run lists them)")
    except ConfigError as e:
        print(f"plan.py: error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if a.cells is None:
        S, B, W, plans = planned[0]
        return _cell(a, plans, f"S{S}-B{B}-W{W}", a.output, base, link, mem, cfg, cuda, console)
    root = a.output or Path("plans") / f"map-{time.strftime('%Y%m%d-%H%M%S')}"
    rc = 0
    for S, B, W, plans in planned:
        cell = f"S{S}-B{B}-W{W}"
        rc = _cell(a, plans, cell, root / cell, base, link, mem, cfg, cuda, console) or rc
    return (_map(root) if not a.dry_run else 0) or rc


def _cells(text: str) -> list[tuple[int, int, int]]:
    out = []
    for c in text.split():
        parts = c.split(":")
        if len(parts) != 3 or not all(x.isdigit() and int(x) > 0 for x in parts):
            raise ConfigError(f"--cells {c}: each cell is S:B:W, three positive integers (e.g. 4608:8:8)")
        out.append(tuple(int(x) for x in parts))
    if not out:
        raise ConfigError("--cells: give at least one S:B:W")
    return out


def _cell(a, plans, cell: str, out: Path | None, base, link, mem, cfg, cuda: bool, console) -> int:
    """One cell: what is left out and why, then its plans run in this process and ranked into out/plan.json."""
    from flux_cp.plan.plans import to_sweep

    if a.only:
        only = set(a.only.split(","))
        for q in plans:
            if q.pruned is None and q.name not in only:
                q.pruned = "not in --only"
    kept = [q for q in plans if q.pruned is None]
    console.rule(cell)
    config = Path(a.config).name if a.config else ("flux_4608.yaml" if cuda else "tiny.yaml")  # --config's default
    console.print(f"plan {cell}: {len(plans)} plans, {len(kept)} to run ({'GPU' if cuda else 'CPU'}: {config}"
                  f"{f', {mem:.0f} GiB a GPU' if mem else ''})", highlight=False)
    reasons: dict[str, list[str]] = {}
    for q in plans:
        if q.pruned:
            reasons.setdefault(q.pruned, []).append(q.name)
    for why, names in reasons.items():  # each reason once, with the plans it leaves out
        console.print(f"  left out {', '.join(names)}: {why}", highlight=False, soft_wrap=True)
    if a.dry_run:
        for q in kept:
            print(f"{q.name}: ~{q.memory_gib:.1f} GiB a rank estimated")
        return 0
    out = out or Path("plans") / f"{cell}-{time.strftime('%Y%m%d-%H%M%S')}"
    sweep = to_sweep(plans, base, out, name=f"plan-{cell}", steps=a.steps + a.warmup_steps)
    rc = _run(sweep, console)
    return _finish(plans, out, link, mem, cfg, cell, console) or rc


def _run(sweep, console) -> int:
    """Every plan in this process (imports once), with sweep.py's runner: a failed plan is recorded, not fatal."""
    import importlib.util

    from flux_cp.runs.sweep import Runner

    spec = importlib.util.spec_from_file_location("sweep_script", Path(__file__).with_name("sweep.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    runner = Runner(sweep, console=console, in_process=script._with_compile_cache(script._train_bench_main()))
    with script._progress(console) as progress:
        return 1 if runner.run(progress) else 0


def _finish(plans, out: Path, link, mem, cfg, cell: str, console) -> int:
    from rich.console import Console
    from rich.table import Table

    from flux_cp.plan.rank import best_against_dp, rank

    rows = rank(plans, out, link, mem, cfg.config_file and os.path.relpath(cfg.config_file))
    summary = best_against_dp(rows)
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    (out / "plan.json").write_text(json.dumps({"cell": cell, "device": device, "link": getattr(link, "name", str(link)),
                                               "memory_gib": mem, "plans": rows, "summary": summary}, indent=1))
    t = Table(title=f"{cell}: time per global batch, fastest first (W >= 2: a simulated rank, links priced; "
              "DP: plain data parallelism)")
    for col in ("#", "plan", "step ms", "tokens/s a GPU", "MFU", "peak GiB", "exposed comm ms"):
        t.add_column(col, justify="left" if col == "plan" else "right", no_wrap=col == "plan")
    for r in rows:
        if r["status"] != "ran":
            continue
        t.add_row(str(r["rank"]), r["plan"] + (" DP" if r["baseline"] else ""), f"{r['step_ms']:.3g}",
                  f"{r['tokens_per_s_per_gpu']:,.0f}", "-" if r["mfu"] is None else f"{r['mfu']:.0%}",
                  "-" if r["peak_gib"] is None else f"{r['peak_gib']:.3g}",
                  "-" if r["exposed_comm_ms"] is None else f"{r['exposed_comm_ms']:.3g}")
    Console(width=max(110, Console().width)).print(t)
    for r in rows:
        if r["status"] not in ("ran", "pruned"):
            console.print(f"  {r['plan']}: {r['status']}: {r['why']}", highlight=False, soft_wrap=True)
    best, dp = summary["best"], summary["data_parallel"]
    if best is None:
        print(f"plan {cell}: no plan ran ({out}/plan.json)")
        return 1
    vs = (f", {summary['best_over_dp']:.2f}x plain data parallelism ({dp['plan']})" if dp and dp is not best
          else " (plain data parallelism)" if best["baseline"] else ", no data-parallel plan ran")
    print(f"best: {best['plan']}: {best['tokens_per_s_per_gpu']:,.0f} tokens/s a GPU"
          + (f", MFU {best['mfu']:.0%}" if best["mfu"] is not None else "") + vs)
    print(f"run it: {best['command']}")
    print(f"plans: {out}/plan.json")
    return 0


def _map(root: Path) -> int:
    from flux_cp.plan.decision_map import draw, load_map, render_markdown

    rows = load_map(root)
    if not rows:
        print(f"plan.py: error: --map {root}: no <cell>/plan.json under it (run cells first: tools/plan_map.sh)",
              file=sys.stderr)
        return EXIT_CONFIG
    devices = sorted({r["device"] or "device not recorded" for r in rows})
    (root / "map.json").write_text(json.dumps(rows, indent=1))
    (root / "map.md").write_text(render_markdown(rows) + "\n")
    draw(rows, root / "map.png", title=f"{', '.join(devices)}; W >= 2: a simulated rank, collectives priced")
    print(render_markdown(rows))
    print(f"map: {root}/map.md, map.png, map.json ({len(rows)} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
