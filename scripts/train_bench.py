"""Flux DiT training-step benchmark under context parallelism.

    python scripts/train_bench.py                       # GPU: configs/flux_4608.yaml; no GPU: configs/tiny.yaml
    python scripts/train_bench.py --devices 2           # two ranks (Lightning launches them)
    python scripts/train_bench.py --devices 1 --cp torch --config configs/flux_4608.yaml
    python scripts/train_bench.py --ops-only --seq-lens 4608,100000 --simulate-world 2,4,8 --seed-compat

Writes <output>/summary.json (default output: a new runs/<run_name>/<time>; an --output holding a complete run
needs --overwrite, flux_cp/runs/outputs.py) and, unless --wandb-mode disabled, an offline wandb run under
<output>/wandb (sync it with `wandb sync`).
"""

import os
import signal
import sys
import time
import warnings
from pathlib import Path

if __name__ == "__main__":  # a Ctrl-C while importing ends quietly; main() then installs the run's own stop guard
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from flux_cp.checks import check_installed, resolve  # noqa: E402
from flux_cp.config import ConfigError, parse_config, run_name  # noqa: E402
from flux_cp.runs.outputs import run_dir  # noqa: E402


def is_launcher_process() -> bool:
    """True in the process the user started (Lightning's DDP launcher sets LOCAL_RANK in the others)."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def quiet() -> None:
    """What a run prints is its own: wandb's banner and hints, Lightning's tips and info lines, a deprecation
    warning from Lightning's pytree helper stay out (WANDB_SILENT=false brings wandb's back)."""
    os.environ.setdefault("WANDB_SILENT", "true")
    warnings.filterwarnings("ignore", r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*IterableDataset.*__len__.*")
    # diffusers' FluxSingleTransformerBlock returns slices of one tensor; FSDP2 (torch >= 2.13) warns that an in-place
    # op on such a view would skip its all-gather. FluxDiT only reads them (torch.cat, norms): exact against one
    # process in fp64 (tests/test_mesh.py, --weights fsdp); docs/reference.md says so.
    warnings.filterwarnings("ignore", r"FSDP2-wrapped module \(.*\) returned a view tensor")


def main(argv: list[str] | None = None) -> int:
    quiet()
    guard = None
    if argv is None:  # the command line: the first Ctrl-C or SIGTERM ends the run within seconds, wherever it is
        from flux_cp.runs.interrupt import install

        guard = install(launcher=is_launcher_process())
    import torch

    from flux_cp.measure.timing import deepen_launch_queue

    deepen_launch_queue()  # before CUDA starts: the idle probe's host must not wait on the device

    try:
        given = sys.argv[1:] if argv is None else argv
        cfg = parse_config(given, cuda_available=torch.cuda.is_available())
        cfg = resolve(cfg, cuda_available=torch.cuda.is_available(), gpu_count=torch.cuda.device_count())
        check_installed(cfg.run)
        # global rank 0's process claims the run folder before any other rank starts (flux_cp/runs/outputs.py)
        claimer = is_launcher_process() and os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"
        mode = "ops" if cfg.run.ops_only else "train"
        cfg.run.output = run_dir(cfg.run.output, run_name(cfg, mode), cfg.run.overwrite, claimer)
        if guard is not None and claimer:
            from flux_cp.runs.outputs import release_claim

            guard.add(lambda signum: release_claim(Path(cfg.run.output)), final=True)
    except ConfigError as e:
        print(f"train_bench.py: error: {e}", file=sys.stderr)
        return 2
    if is_launcher_process() and cfg.run.warmup_steps == 0 and not cfg.run.ops_only:
        print("train_bench.py: warning: --warmup-steps 0: the first step (allocations, kernel choice, caches; often "
              "10x a steady one) is measured", file=sys.stderr)
    if is_launcher_process() and (cfg.config_overlays or not any(a.startswith("--config") for a in given)):
        where = "a GPU is visible" if cfg.run.accelerator == "gpu" else "no GPU found: a tiny CPU config"
        over = f"{', '.join(cfg.config_overlays)} names no model: laid over " if cfg.config_overlays else "using "
        print(f"train_bench.py: {over}{cfg.config_file} ({where}; a model config first chooses another: "
              f"--config configs/flux_4608.yaml{' --config ' + cfg.config_overlays[0] if cfg.config_overlays else ''})",
              file=sys.stderr)
    if is_launcher_process() and cfg.run.accelerator == "cpu" and not cfg.run.ops_only:
        warn_long_cpu_step(cfg)
    from flux_cp.measure.host_load import slowed_host

    with slowed_host(cfg.run.host_slowdown):
        return _run(cfg, given)


def warn_long_cpu_step(cfg) -> None:
    """A step this CPU would take minutes over (Flux's dims, say) is announced before the run starts, with what fits."""
    from flux_cp.data import DTYPES
    from flux_cp.measure.flops import CPU_STEP_WARN_S, cpu_rate, cpu_step_estimate_s

    run = cfg.run
    samples = cfg.data.batch_size * run.dp
    if run.simulate_world:  # this process trains one rank's share of the job
        samples /= run.world_size
    est = cpu_step_estimate_s(cfg, samples, cpu_rate(DTYPES[run.precision]))
    if est > CPU_STEP_WARN_S:
        print(f"train_bench.py: warning: a step of this model ({cfg.data.seq_len} tokens, hidden {cfg.model.hidden}, "
              f"{cfg.model.double_blocks} + {cfg.model.single_blocks} blocks) takes at least ~{est / 60:.0f} min on "
              f"this CPU ({run.warmup_steps + run.steps} steps): the CPU's model is --config configs/tiny.yaml "
              "(seconds a run); Flux's dims are for a GPU", file=sys.stderr)


def _run(cfg, given: list[str]) -> int:
    from flux_cp.runs.process_state import forget_process_groups

    # main() called again in one process (tests, the planner): a Lightning run leaves its group (a simulated rank's
    # fake one) for its atexit hook, and a W=1 bare run would wrap its model in DDP over it
    forget_process_groups()
    if cfg.run.harness == "bare":  # no Lightning imported: its start-up is not the bare loop's
        from flux_cp.train.bare import run_bare

        return run_bare(cfg, [sys.executable, str(Path(__file__).resolve()), *given], report=print_summary)
    import logging

    import lightning  # noqa: F401  (it sets its loggers' level on import: lowered after)

    for name in ("lightning.pytorch", "lightning.fabric"):  # "GPU available", tips; warnings stay
        logging.getLogger(name).setLevel(logging.WARNING)
    if cfg.run.ops_only:
        from flux_cp.opbench import run_ops

        return run_ops(cfg)
    return train(cfg)


def train(cfg) -> int:
    import lightning as L

    from callbacks import (
        BareTwinCallback,
        FaultInjectionCallback,
        GcScheduleCallback,
        GuardCallback,
        KernelProfileCallback,
        OpTimingCallback,
        ResilientWandbLogger,
        SigtermEveryCallback,
        StepProgressBar,
        SyncDebugCallback,
    )
    from flux_cp.model import num_params
    from flux_cp.runs.failures import (
        EXIT_CODES,
        Watchdog,
        culprit,
        error_kind,
        error_line,
        kill_tree,
        out_of_space,
        remove_heartbeats,
    )
    from flux_cp.runs.header import filter_keys, run_tags, train_header
    from flux_cp.runs.interrupt import active as active_guard
    from flux_cp.runs.results import (
        ERROR_FILE_PREFIX,
        read_errors,
        wall_split,
        write_json_atomic,
    )
    from flux_cp.train.module import FluxCPModule
    from flux_cp.train.strategies import lightning_precision, lightning_strategy

    run = cfg.run
    name = run_name(cfg)
    out = Path(run.output)  # claimed in main(): fresh, or cleared of an earlier run's record
    # Backstop for a stalled step, in every rank; the process-group timeout below normally fires first.
    # at: when this rank stalled, if it stalled outside torch (the rank the others waited for: its error comes first)
    watchdog = Watchdog(run.timeout_s, on_fire=lambda exc, at: timing.record_failure(trainer.global_rank, exc, at))
    watchdog.start()
    if (guard := active_guard()) is not None:  # stopped by a signal: what was measured, and no rank or heartbeat left
        def on_stop(signum):  # in the launcher, which is the reporting rank (global rank 0, or the simulated rank)
            watchdog.stop()
            timing.stopped(timing.report_rank, signum)
            remove_heartbeats(out)

        guard.add(on_stop)

    module = FluxCPModule(cfg)
    plugins = []
    if run.simulate_world:  # this process is one rank of a W-rank job over torch's fake process group
        from flux_cp.parallel.fake_group import init_fake_world
        from flux_cp.train.strategies import SimulatedEnvironment

        init_fake_world(run.simulate_world, run.simulate_rank)
        plugins.append(SimulatedEnvironment(run.simulate_world, run.simulate_rank))
    # DDP or FSDP2 (ModelParallelStrategy) over the dp x cp ranks, real or simulated
    strategy = lightning_strategy(run)
    header = train_header(cfg, num_params(module.model))
    profile_steps = run.profile_steps if run.profile else 0  # extra steps after warm-up, out of the statistics
    timing = OpTimingCallback(
        out / "summary.json",
        header,
        run.warmup_steps,
        profile_steps=profile_steps,
        regions_every=run.regions_every,
        idle_probe_every=run.idle_probe_every,
        report_rank=run.simulate_rank if run.simulate_world else 0,
    )
    bar = sys.stderr.isatty() and sys.stdout.isatty()  # a live bar in a log file is control codes
    callbacks = [timing, GuardCallback(watchdog, out), SigtermEveryCallback(run.sigterm_every, timing.summary.header)]
    callbacks += [StepProgressBar(timing.skip, run.steps)] if bar else []
    if run.sync_debug:  # first: its figures are in the summary the timing callback writes at the end
        callbacks.insert(0, SyncDebugCallback(timing, run.warmup_steps + profile_steps))
    if run.gc_every:
        callbacks.append(GcScheduleCallback(run.gc_every))
    if run.interleave_bare:  # after the timing callback: a twin block runs once the Lightning step is closed
        callbacks.append(BareTwinCallback(cfg, run.interleave_bare, timing))
    if fault := FaultInjectionCallback.from_env():  # tests only (FLUX_CP_FAULT)
        callbacks.append(fault)
    if run.profile:
        callbacks.append(KernelProfileCallback(timing, out, run.warmup_steps, profile_steps))
    logger = False
    if run.wandb_mode != "disabled":
        logger = ResilientWandbLogger(
            project="flux-cp",
            name=f"{name}-{time.strftime('%m%d-%H%M%S')}",  # unique and readable: repeated runs share run_name
            group=run.group,
            job_type="train",
            tags=run_tags(cfg),  # LoRA runs filter apart from full fine-tuning (lora_rank, trainable_params: config)
            save_dir=str(out),
            offline=run.wandb_mode == "offline",
            config={**filter_keys(cfg, header), **cfg.to_dict(), "env": header["env"],
                    "collectives": header["collectives"], "simulate": header["simulate"]},
        )
    precision = lightning_precision(run)
    trainer = L.Trainer(
        accelerator=run.accelerator,
        devices=run.devices,
        num_nodes=run.num_nodes,
        strategy=strategy,
        precision=precision["precision"],
        plugins=plugins + precision.get("plugins", []) or None,  # 64-true under fsdp: a plugin (lightning_precision)
        max_steps=run.warmup_steps + profile_steps + run.steps,
        logger=logger,
        callbacks=callbacks,
        default_root_dir=str(out),
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=bar,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        use_distributed_sampler=False,  # SyntheticFlow splits over dp itself; CP ranks then take their shard
        log_every_n_steps=1,
    )
    try:
        trainer.fit(module)
    except BaseException as e:  # recorded in summary.json by the callbacks; here: the exit code, no orphans
        # Any rank, before the others go: the rank they waited for (hung, or died without a word) is the run's error,
        # not the consequent one of the rank that noticed (Lightning's launcher may kill a hung rank 0 meanwhile).
        recorded = {x["error_rank"] for x in read_errors(out)} | {trainer.global_rank}
        # (not when interrupted: then Lightning's launcher has already killed the other ranks itself)
        if run.world_size > 1 and error_kind(e) != "interrupted" and (c := culprit(out, run.world_size, recorded)):
            c["shape"] = (read_errors(out) or [{}])[0].get("shape")
            write_json_atomic(out / f"{ERROR_FILE_PREFIX}{c['error_rank']}.json", c)
            timing.summary.write(complete=False)  # every rank holds the gathered summary
        if is_launcher_process():
            kill_tree(os.getpid())  # the other ranks, if still running (e.g. stuck in a collective)
            remove_heartbeats(out)
        errors = read_errors(out)  # the run's first error (maybe another rank's) decides the exit code
        kind, line = (errors[0]["error_kind"], errors[0]["error"]) if errors else (error_kind(e), error_line(e))
        if out_of_space(e):  # summary.json kept its last good version: it lacks the last steps and the error
            line += f" (out of disk space, quota or file-size limit: {out / 'summary.json'} is out of date)"
        print(f"train_bench.py: rank {trainer.global_rank}: run failed ({kind}): {line}", file=sys.stderr)
        watchdog.stop()  # a sweep may run the next run in this process (scripts/sweep.py --in-process)
        return EXIT_CODES[kind]
    watchdog.stop()
    if trainer.global_rank == timing.report_rank:
        w = timing.wall  # teardown: Lightning's strategy and logger after the last step
        timing.summary.header["wall_s"] = wall_split(w["run"], w["start"], w.get("warm", w["start"]), w["end"],
                                                     time.time())
        timing.summary.write(complete=True)
        print_summary(timing.summary.to_dict(complete=True), out / "summary.json")
        if logger and logger.failed:
            print(f"train_bench.py: wandb failed ({logger.failed}); summary.json is complete", file=sys.stderr)
    return 0


def print_summary(d: dict, path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    kinds = d.get("step_kinds") or {"plain": d["metrics"].get("step_ms", {}).get("n", 0)}
    what = ", ".join(f"{n} {k}" for k, n in kinds.items())  # plain steps give step_ms; see docs/reference.md
    table = Table(title=f"{d['run_name']}  ({d['env']['device']}, {sum(kinds.values())} measured steps: {what})")
    for col in ("metric", "median", "min", "max", "rank max (median)"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    first = ["step_ms", "host_ms", "device_busy_ms", "loop_ms", "data_ms", "transfer_ms",
             "prologue_ms", "after_ms", "gc_ms", "step_timed_ms", "step_after_probe_ms"]  # the step, then its parts

    def order(name: str):
        return (0, first.index(name)) if name in first else (1, name)

    for name, m in sorted(d["metrics"].items(), key=lambda kv: order(kv[0])):
        if name.endswith("_call_ms"):
            continue
        spread = f"{m['rank_max_median']:.3f}" if "rank_max_median" in m else "-"
        table.add_row(name, f"{m['median']:.3f}", f"{m['min']:.3f}", f"{m['max']:.3f}", spread)
    console = Console()  # the run's result, its answer line last, on stdout; progress and warnings on stderr
    console.print(table)
    notes = []
    if "idle" in d:
        notes.append(f"device idle {100 * d['idle']['device_idle_frac']:.1f}% of the step (events)")
        if "loop_idle_frac" in d["idle"]:
            loop = 100 * d["idle"]["loop_idle_frac"]
            notes.append(f"device idle {loop:.1f}% of the loop's period (gaps between steps too)")
    if st := d.get("steadiness"):
        lo, hi = st["ci95"]
        line = f"step median {st['median']:.3f} ms (95% CI {lo:.3f}-{hi:.3f}, {st['n']} plain steps)"
        if st["modes"]:
            line += ", bimodal: " + ", ".join(f"{m['median']:.3f} ms x {m['n']}" for m in st["modes"])
        notes.append(line + ("" if st["steady"] else f"; not steady ({', '.join(st['problems'])})"))
    if w := d.get("wall_s"):
        notes.append(f"wall time {w['total']:.1f} s: start-up {w['startup']:.1f}, warm-up {w['warmup']:.1f}, "
                     f"measured {w['measured']:.1f}, teardown {w['teardown']:.1f}")
    if "timing_overhead_pct" in d:
        notes.append(f"op regions' overhead {d['timing_overhead_pct']:+.2f}% (steps with them against plain steps)")
    if d.get("compile", {}).get("compile_s") is not None:
        notes.append(f"compile {d['compile']['compile_s']:.1f} s (warm-up, not in step times)")
    if "profile" in d:
        p = d["profile"]
        notes.append(f"profiler: device idle {100 * p.get('idle_frac', 0):.1f}%, traces in {path.parent / 'traces'}")
    if "syncs" in d:
        s = d["syncs"]
        notes.append(f"synchronizing calls: {s['per_step']:.2f} per measured step ({s['steps']} steps)")
        notes += [f"  {site['count']} x {' <- '.join(reversed(site['stack'][-3:]))}" for site in s["sites"][:5]]
    for n in notes:
        console.print(n)
    if d.get("simulate"):
        sim = d["simulate"]
        console.print(f"simulated: rank {sim['rank']} of a {sim['world']}-rank job over torch's fake process group "
                      "(collectives move nothing: losses not meaningful, communication in summary.json's comm ledger)")
    if c := d.get("contention"):
        gib = c["bus_bytes"] / 2**30
        console.print(f"contention: {c['kernels']} traffic kernels ({c['ctas']} CTAs each), {gib:.2f} GiB of bus bytes "
                      f"over {c['priced_ms']:.1f} ms priced ({c['link']})")
    if d.get("comm", {}).get("per_step"):  # none at one rank
        per = ", ".join(f"{k} {v['count']} x ({v['bytes'] / 2**20:.1f} MiB)" for k, v in d["comm"]["per_step"].items())
        console.print(f"collectives per step: {per}")
    if d["loss"]:
        console.print(f"loss: first {d['loss'][0]:.6f}  last {d['loss'][-1]:.6f}", soft_wrap=True)
    console.print(f"summary: {path}", soft_wrap=True)
    if d["mode"] == "train" and "step_ms" in d["metrics"]:
        from flux_cp.runs.verdict import verdict

        roots = [r for r in dict.fromkeys([Path("runs"), path.parent.parent]) if r.is_dir()]
        for line in verdict(d, path.parent, roots):
            console.print(line, soft_wrap=True, highlight=False, markup=False)


if __name__ == "__main__":
    sys.exit(main())
