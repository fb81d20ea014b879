"""For my batch, sequence length and GPUs, what trains fastest? Every plan of W GPUs ranked in tokens/s a GPU and MFU,
plain data parallelism among them (the baseline to beat).

    python scripts/plan.py --config configs/flux_4608.yaml --seq-len 4608 --global-batch 8 --world 8   # one GPU
    python scripts/plan.py --global-batch 2 --world 2 --builds eager          # no GPU: the tiny model on the CPU
    python scripts/plan.py ... --dry-run                                     # the plans and why some are left out
    python scripts/plan.py --cells "4608:1:1 4608:8:8 65536:1:8" --output map   # cells S:B:W in one process, + map
    python scripts/plan.py --map runs/plan_map/map       # the decision map of the cells under it: map.md, map.png
    python scripts/plan.py --config configs/flux1.yaml --cells "4608:32:8" --builds compiled --checkpointing selective \
        --memory-gib 80 --measured runs/gpu_call --output map   # ranked from runs measured before (suites), no GPU

Each plan runs in this process as rank 0 of its W-rank job over torch's fake process group (the real code with a
rank's shapes; collectives move nothing and are recorded), then its collectives are priced with --link and placed on
its step as scripts/report.py does. W >= 2 figures are therefore a simulated rank with priced links, not a measured
W-GPU job. Writes <output>/plan.json (`plans`: every row, ranked; paths in it relative to its folder) and
<output>/<plan>/summary.json per run; the default <output> is under plans/ (git-ignored). Each ranked plan carries
its measured steps and its step's 95% confidence interval; neighbours whose intervals overlap are a tie (= beside
the rank: the order between them is within the noise). A plan whose measured peak exceeds --memory-gib is listed
as over memory, unranked. Bad input is refused in one line (exit 2) before anything runs or is written.
"""

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from flux_cp.checks import check_lora  # noqa: E402
from flux_cp.config import ConfigError, parse_config  # noqa: E402
from flux_cp.runs.cli import Parser, at_least, check_folder, first_sentences, items, load_link, positive  # noqa: E402
from flux_cp.runs.failures import EXIT_CONFIG  # noqa: E402

DEFAULT_ROOT = Path("plans")  # git-ignored: a plan's runs are measurements of this machine, not sources


def parser() -> Parser:
    p = Parser(prog="plan.py", description=first_sentences(__doc__))
    p.add_argument("--config", default=None, help="model config (default: configs/flux_4608.yaml on a GPU, "
                   "configs/tiny.yaml without one)")
    p.add_argument("--seq-len", type=at_least(1), default=None,
                   help="tokens a sample, image + text (default: the config's)")
    p.add_argument("--global-batch", type=at_least(1), help="samples an optimizer step, over all GPUs (required)")
    p.add_argument("--world", type=at_least(1), help="GPUs (W) (required)")
    p.add_argument("--cells", default=None, metavar="S:B:W ...", help="several cells (sequence length, global "
                   "batch, GPUs), space-separated, run one after another in this process (imports and the CUDA "
                   "context once): each into <output>/S<S>-B<B>-W<W>/, then the decision map of them all")
    p.add_argument("--builds", default="eager", help="eager, compiled and/or graph, comma-separated (compiled: per "
                   "block, as FSDP and FP8 run best; graph: the same, the step replayed from one CUDA graph; both GPU "
                   "only, each compiles for ~30-60 s). Default: eager (a cell of ~30 plans in ~3 minutes of an H100)")
    p.add_argument("--cp", default=None, help="strategies within a group, comma-separated (default: all that apply)")
    p.add_argument("--checkpointing", default="none", help="activation checkpointing modes, comma-separated: none, "
                   "selective, full (each plan in each; the memory estimate prunes by what each keeps).")
    p.add_argument("--fp8", default="none", help="FP8 linears, comma-separated: none, tensorwise, rowwise, "
                   "tensorwise-ag8 (FSDP gathering the float8 weights in float8; GPU, torchao; MFU stays against the "
                   "bf16 peak)")
    p.add_argument("--lora-rank", type=at_least(0), default=0, help="LoRA: every plan trains adapters of this rank, "
                   "the base frozen (0: full fine-tuning); its FLOPs, memory and collectives are LoRA's")
    p.add_argument("--lora-targets", default=None, help="LoRA's adapted linears (presets attention, mlp, or module "
                   "names; default attention)")
    p.add_argument("--weights", default="ddp,zero2,zero2f,fsdp,fsdpoff", help="weights modes, comma-separated "
                   "(zero2f: ZeRO-2 gathering its parameters under the next forward; fsdpoff: FSDP with its shards and "
                   "AdamW state in host memory, planned only where fsdp, or at W = 1 ddp, does not fit)")
    p.add_argument("--only", default=None, metavar="PLAN,...", help="run only these plans (names as the table "
                   "gives them, e.g. dp8-zero2-eager; with --cells, each cell runs those it has); the others are "
                   "listed as left out")
    p.add_argument("--memory-gib", type=positive("GiB"), default=None,
                   help="a GPU's memory (default: this GPU's; none on the CPU): plans estimated above it are left out, "
                   "plans measured above it are listed as over memory")
    p.add_argument("--link", default="h200-nvlink4", help="link profile the collectives are priced with (a "
                   "configs/links name or a YAML file)")
    p.add_argument("--steps", type=at_least(1), default=12, help="measured steps a plan")
    p.add_argument("--warmup-steps", type=at_least(0), default=4,
                   help="warm-up steps a plan (graph builds: at least 12)")
    p.add_argument("--output", type=Path, default=None, help="the plan's folder (default: plans/<cell>-<time>, "
                   "git-ignored)")
    p.add_argument("--measured", type=Path, nargs="+", default=None, metavar="DIR", help="run nothing: each plan "
                   "from a complete run under these folders (a suite's) whose settings are the plan's; plans no run "
                   "matches are listed as not measured (e.g. Flux.1's depth, measured by configs/suites/flux1_*)")
    p.add_argument("--dry-run", action="store_true", help="list the plans and why some are left out; run nothing")
    p.add_argument("--map", type=Path, default=None, metavar="DIR", help="run nothing: the decision map of the "
                   "cells' plan.json files under DIR (the best plan, runner-up and plain DP a cell) -> DIR/map.md, "
                   "map.json, map.png")
    return p


def main(argv: list[str] | None = None) -> int:
    from flux_cp.measure.timing import deepen_launch_queue

    deepen_launch_queue()  # before CUDA starts (in-process runs share its context): the idle probe must not stall
    p = parser()
    a = p.parse_args(argv)
    if a.map is not None:
        return _map(a.map)
    if a.cells is None and (a.global_batch is None or a.world is None):
        p.error("--global-batch and --world are required (or --cells S:B:W ..., or --map DIR)")
    if a.cells is not None and (a.global_batch or a.world or a.seq_len):
        p.error("--cells names each cell's S, B and W: drop --seq-len, --global-batch and --world")

    import torch
    from rich.console import Console

    from flux_cp.plan.plans import BUILDS, CHECKPOINTING, CP_KINDS, FP8, WEIGHTS, enumerate_plans

    console = Console(stderr=True)
    cuda = torch.cuda.is_available() or a.measured is not None  # measured runs were a GPU's: plans as there
    try:  # every check before anything is written or run: one line, exit 2
        cells = _cells(a.cells) if a.cells is not None else [(a.seq_len, a.global_batch, a.world)]
        builds = tuple(items("--builds", a.builds, tuple(BUILDS)))
        if set(builds) - {"eager"} and not cuda and not a.dry_run:  # listed on paper (--dry-run), run on a GPU
            raise ConfigError(f"--builds {a.builds}: compiled builds run on a GPU (use --builds eager here, or "
                              "--dry-run to list their plans)")
        cps = tuple(items("--cp", a.cp, CP_KINDS)) if a.cp is not None else CP_KINDS
        weights = tuple(items("--weights", a.weights, WEIGHTS))
        checkpointing = tuple(items("--checkpointing", a.checkpointing, CHECKPOINTING))
        fp8 = tuple(items("--fp8", a.fp8, FP8))
        only = set(items("--only", a.only)) if a.only is not None else None
        a.cps, a.weight_modes = cps, weights
        base = (["--config", a.config] if a.config else []) + ["--steps", str(a.steps), "--warmup-steps",
                                                               str(a.warmup_steps), "--wandb-mode", "disabled"]
        if a.lora_rank or a.lora_targets is not None:  # every plan LoRA's (its checks: a rank, targets the model has)
            base += ["--lora-rank", str(a.lora_rank)] + (["--lora-targets", a.lora_targets] if a.lora_targets else [])
        cfg = parse_config(base, cuda_available=cuda)
        check_lora(cfg.run, cfg.model)  # train_bench's own line, here rather than as every plan's pruned reason
        mem = a.memory_gib if a.memory_gib is not None else (
            torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None)
        link = load_link("--link", a.link)
        cells = [(S if S is not None else cfg.data.seq_len, B, W) for S, B, W in cells]
        # every cell's plans before any runs: a bad cell is refused before the first plan's minutes go
        planned = [(S, B, W, enumerate_plans(cfg, S, B, W, builds=builds, cps=cps, weights=weights,
                                             checkpointing=checkpointing, fp8=fp8, memory_gib_limit=mem,
                                             on_gpu=cuda))
                   for S, B, W in cells]
        _select(only, planned, a.cells is not None)
        if a.measured is not None:
            for d in a.measured:
                if not d.is_dir():
                    raise ConfigError(f"--measured {d}: not a folder (give folders holding runs' summary.json)")
            from flux_cp.plan.measured import index_runs

            a.measured_runs = index_runs(a.measured)  # read once, matched cell by cell
        if not a.dry_run and a.measured is None:
            for S, B, W, plans in planned:
                _runnable(plans, f"--cells {S}:{B}:{W}" if a.cells is not None else
                          f"--seq-len {S} --global-batch {B} --world {W}")
        root = a.output or DEFAULT_ROOT / (f"map-{time.strftime('%Y%m%d-%H%M%S')}" if a.cells is not None else
                                           f"S{cells[0][0]}-B{cells[0][1]}-W{cells[0][2]}-"
                                           f"{time.strftime('%Y%m%d-%H%M%S')}")
        check_folder("--output", root)
        for S, B, W, _ in planned:
            _other_plan("--output", root / f"S{S}-B{B}-W{W}" if a.cells is not None else root, f"S{S}-B{B}-W{W}")
    except ConfigError as e:
        print(f"plan.py: error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if a.cells is None:
        S, B, W, plans = planned[0]
        return _cell(a, plans, f"S{S}-B{B}-W{W}", W, root, base, link, mem, cfg, cuda, console)
    rc = 0
    for S, B, W, plans in planned:
        cell = f"S{S}-B{B}-W{W}"
        rc = _cell(a, plans, cell, W, root / cell, base, link, mem, cfg, cuda, console) or rc
    return (_map(root) if not a.dry_run else 0) or rc


def _select(only: set[str] | None, planned, several: bool) -> None:
    """--only: the plans not named are left out; a name no cell has, or that no cell can run, is refused."""
    if only is None:
        return
    cells = [(f"S{S}-B{B}-W{W}", plans) for S, B, W, plans in planned]
    where = cells[0][0] if not several else "any cell"
    if unknown := only - {q.name for _, ps in cells for q in ps}:
        raise ConfigError(f"--only {','.join(sorted(unknown))}: no such plan in {where} (--dry-run lists them)")
    for name in sorted(only):
        if not any(q.name == name and q.pruned is None for _, ps in cells for q in ps):
            why = next(q.pruned for _, ps in cells for q in ps if q.name == name)
            raise ConfigError(f"--only {name}: left out in {cells[0][0] if not several else 'each cell that has it'}: "
                              f"{why}")
    for _, plans in cells:
        for q in plans:
            if q.pruned is None and q.name not in only:
                q.pruned = "not in --only"


def _runnable(plans, setting: str) -> None:
    """A cell none of whose plans can run is bad input: nothing would be measured."""
    if plans and any(q.pruned is None for q in plans):
        return
    if not plans:
        raise ConfigError(f"{setting}: no plan of these --cp and --weights (--dry-run lists them)")
    q = plans[0]
    raise ConfigError(f"{setting}: none of its {len(plans)} plans can run (e.g. {q.name}: {q.pruned}); --dry-run "
                      "lists why each is left out")


def _other_plan(flag: str, out: Path, cell: str) -> None:
    """An --output holding another cell's plan.json is refused (the same cell's: its runs resume)."""
    f = out / "plan.json"
    if f.is_dir() or (f.exists() and not f.is_file()):
        raise ConfigError(f"{flag} {out}: its plan.json is not a file (give another folder)")
    if not f.exists():
        return
    try:
        held = json.loads(f.read_text()).get("cell")
    except (OSError, ValueError, AttributeError):
        held = None
    if held != cell:
        raise ConfigError(f"{flag} {out}: holds {'the plan of ' + str(held) if held else 'a plan.json it cannot read'}"
                          f", not {cell}'s (give another folder, or leave --output out for a new one)")


def _cells(text: str) -> list[tuple[int, int, int]]:
    out = []
    for c in text.split():
        parts = c.split(":")
        if len(parts) != 3 or not all(x.isdigit() and int(x) > 0 for x in parts):
            raise ConfigError(f"--cells {c}: each cell is S:B:W, three positive integers (e.g. 4608:8:8)")
        if (cell := tuple(int(x) for x in parts)) in out:
            raise ConfigError(f"--cells {c}: named twice (each cell once)")
        out.append(cell)
    if not out:
        raise ConfigError(f"--cells {text!r}: give at least one S:B:W (e.g. --cells \"4608:1:1 4608:8:8\")")
    return out


def _cell(a, plans, cell: str, W: int, out: Path, base, link, mem, cfg, cuda: bool, console) -> int:
    """One cell: what is left out and why, then its plans run in this process and ranked into out/plan.json."""
    from flux_cp.plan.plans import count_params, host_gib, to_sweep, unlisted

    kept = [q for q in plans if q.pruned is None]
    console.rule(cell)
    config = Path(a.config).name if a.config else ("flux_4608.yaml" if cuda else "tiny.yaml")  # --config's default
    console.print(f"plan {cell}: {len(plans)} plans, {len(kept)} to {'look up' if a.measured else 'run'} "
                  f"({'GPU' if cuda else 'CPU'}: {config}"
                  f"{f', {mem:.0f} GiB a GPU' if mem else ''})", highlight=False)
    reasons: dict[str, list[str]] = {}
    for q in plans:
        if q.pruned:
            reasons.setdefault(q.pruned, []).append(q.name)
    left = unlisted(W, a.cps, a.weight_modes)
    for why, names in (reasons | left).items():  # each reason once, with the plans (or settings) it leaves out
        console.print(f"  left out {', '.join(names)}: {why}", highlight=False, soft_wrap=True)
    if a.dry_run:
        n = count_params(cfg) if any(q.weights == "fsdpoff" for q in kept) else 0
        for q in kept:  # an offloading plan's host memory beside: the shards, gradients and AdamW state it moved there
            host = f", ~{host_gib(cfg, n, q):.1f} GiB of host memory" if q.weights == "fsdpoff" else ""
            print(f"{q.name}: ~{q.memory_gib:.1f} GiB a rank estimated{host}")
        return 0
    if a.measured is not None:
        return _finish(plans, left, out, link, mem, cfg, cell, console, _link_measured(a, plans, cfg, out, console))
    sweep = to_sweep(plans, base, out, name=f"plan-{cell}", steps=a.steps + a.warmup_steps)
    rc = _run(sweep, console)
    return _finish(plans, left, out, link, mem, cfg, cell, console) or rc


def _link_measured(a, plans, cfg, out: Path, console) -> str:
    """--measured: each plan a run matches linked as out/<plan> (what rank() reads), the others left out as not
    measured; the runs' device."""
    from flux_cp.plan.measured import match

    found = match(cfg, plans, a.measured_runs)
    out.mkdir(parents=True, exist_ok=True)
    for q in plans:
        if q.pruned is None and q.name not in found:
            q.pruned = "not measured (no run under --measured has its settings)"
        elif q.name in found:
            link = out / q.name
            if link.is_symlink():
                link.unlink()
            elif link.exists():  # a plan this folder ran itself: its own run stands
                continue
            link.symlink_to(os.path.relpath(found[q.name]["path"], out), target_is_directory=True)
    console.print(f"  measured: {len(found)} plan{'' if len(found) == 1 else 's'} from runs under "
                  f"{', '.join(map(str, a.measured))}", highlight=False)
    return ", ".join(sorted({r["device"] or "device not recorded" for r in found.values()}))  # "": none matched


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


def _repo_path(path: str | None) -> str | None:
    """A path as the repository root sees it (plan.json's commands run from there): never absolute."""
    return path and os.path.relpath(Path(path).resolve(), ROOT)


def _finish(plans, left: dict, out: Path, link, mem, cfg, cell: str, console, device: str | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from flux_cp.plan.rank import best_against_dp, rank
    from flux_cp.predict.links import name_of

    rows = rank(plans, out, link, mem, _repo_path(cfg.config_file))
    summary = best_against_dp(rows)
    import torch

    if device is None:  # (--measured: the runs' device, "" where none matched)
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    priced = name_of(link)
    (out / "plan.json").write_text(json.dumps({
        "cell": cell, "device": device, "link": priced, "memory_gib": mem, "plans": rows, "summary": summary,
        "left_out": [{"settings": names, "why": why} for why, names in left.items()]}, indent=1))
    t = Table(title=f"{cell}: time per global batch, fastest first (W >= 2: a simulated rank, links priced on "
              f"{priced}; DP: plain data parallelism)")
    for col in ("#", "plan", "step ms (95% CI)", "n", "tokens/s a GPU", "MFU", "peak GiB", "exposed comm ms"):
        t.add_column(col, justify="left" if col == "plan" else "right", no_wrap=col in ("plan", "step ms (95% CI)"))
    ran = [r for r in rows if r["status"] == "ran"]
    for r in ran:
        ci = r["step_ms_ci95"]
        t.add_row(f"{r['rank']}{'=' if r['tied_with'] else ''}", r["plan"] + (" DP" if r["baseline"] else ""),
                  _ms(r["step_ms"]) + ("" if ci is None else f" ({_ms(ci[0])}-{_ms(ci[1])})"), str(r["steps"]),
                  f"{r['tokens_per_s_per_gpu']:,.0f}", "-" if r["mfu"] is None else f"{r['mfu']:.0%}",
                  "-" if r["peak_gib"] is None else f"{r['peak_gib']:.3g}",
                  "-" if r["exposed_comm_ms"] is None else _ms(r["exposed_comm_ms"]))
    table = Console(width=max(120, Console().width))
    table.print(t)
    if any(r["tied_with"] for r in ran):
        table.print("= : within each other's noise (their 95% confidence intervals of the step overlap: the order "
                    "between them is not measured; more --steps narrow them)", highlight=False)
    for r in rows:
        if r["status"] not in ("ran", "pruned"):
            console.print(f"  {r['plan']}: {r['status']}: {r['why']}", highlight=False, soft_wrap=True)
    best, dp = summary["best"], summary["data_parallel"]
    if best is None:
        over = any(r["status"] == "over memory" for r in rows)
        print(f"plan {cell}: no plan ran{' within the memory' if over else ''} ({out}/plan.json)")
        return 1
    vs = (f", {summary['best_over_dp']:.2f}x plain data parallelism ({dp['plan']})" if dp and dp is not best
          else " (plain data parallelism)" if best["baseline"] else ", no data-parallel plan ran")
    tie = f"; within noise of {', '.join(best['tied_with'])}" if best["tied_with"] else ""
    print(f"best: {best['plan']}: {best['tokens_per_s_per_gpu']:,.0f} tokens/s a GPU"
          + (f", MFU {best['mfu']:.0%}" if best["mfu"] is not None else "") + vs + tie)
    print(f"run it: {best['command']}")
    print(f"plans: {out}/plan.json")
    return 0


def _ms(x: float) -> str:
    """Milliseconds at 3 significant figures, whole from 100 on (1,234, not 1.23e+03)."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _map(root: Path) -> int:
    from flux_cp.plan.decision_map import MapError, draw, load_map, render_markdown
    from flux_cp.runs.cli import unwritable

    def refuse(why: str) -> int:
        print(f"plan.py: error: --map {root}: {why}", file=sys.stderr)
        return EXIT_CONFIG

    if not root.is_dir():
        return refuse("not a folder (give the folder holding the cells' <cell>/plan.json, e.g. plan.py --cells "
                      "... --output DIR)")
    try:
        rows = load_map(root)
    except MapError as e:
        return refuse(f"{e} (remove it or run its cell again)")
    if not rows:
        return refuse("no <cell>/plan.json under it (run cells first: tools/plan_map.sh)")
    if why := unwritable(root):
        return refuse(why)
    devices = sorted({r["device"] or "device not recorded" for r in rows if r["best"]}) or ["no plan ran"]
    (root / "map.json").write_text(json.dumps(rows, indent=1))
    (root / "map.md").write_text(render_markdown(rows) + "\n")
    draw(rows, root / "map.png", title=f"{', '.join(devices)}; W >= 2: a simulated rank, collectives priced")
    print(render_markdown(rows))
    print(f"map: {root}/map.md, map.png, map.json ({len(rows)} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
