"""summary.json's header: what a training run is (its settings, model, environment) before it measures anything,
and the few keys runs are filtered and grouped by."""

import os

from flux_cp.measure.host_load import applied
from flux_cp.runs.results import env_info


def checkpointing_header(cfg) -> dict:
    from flux_cp.measure.flops import covered, hardware_flops_factor

    run, m = cfg.run, cfg.model
    n = m.double_blocks + m.single_blocks
    blocks = covered(n, run.checkpointing, run.checkpoint_fraction)
    return {"mode": run.checkpointing, "fraction": run.checkpoint_fraction, "blocks": blocks,
            "hardware_flops_factor": hardware_flops_factor(run.checkpointing, blocks / n)}


def lora_header(cfg) -> dict | None:
    from flux_cp.lora import adapter_params, lora_modules

    run = cfg.run
    if not run.lora_rank:
        return None
    return {"rank": run.lora_rank, "alpha": run.lora_alpha if run.lora_alpha is not None else run.lora_rank,
            "targets": run.lora_targets, "modules": len(lora_modules(cfg.model, run.lora_targets)),
            "trainable_params": adapter_params(cfg.model, run.lora_targets, run.lora_rank)}


def train_header(cfg, params: int) -> dict:
    """summary.json's fields that describe a training run (either harness) before it measures anything."""
    from flux_cp.config import run_name

    run = cfg.run
    return {
        "mode": "train",
        "run_name": run_name(cfg),
        "group": run.group,
        # lightning: the Trainer and this tool's callbacks; bare: the same step in a plain loop (flux_cp/train/bare.py)
        "harness": run.harness,
        "world_size": run.world_size,
        "cp": run.cp,
        "dp": run.dp,
        "cp_degree": run.cp_degree,
        "num_nodes": run.num_nodes,
        # fsdp: the step also holds per-block param all-gathers and grad reduce-scatters; zero: a param broadcast
        "weights": run.weights,
        "config": cfg.to_dict(),
        "env": env_info("cuda" if run.accelerator == "gpu" else "cpu"),
        # --host-slowdown's busy loops and their nominal share (env's host probe: what they did)
        "host_load": applied(run.host_slowdown),
        # CUDA's launch queue (flux_cp.measure.timing.deepen_launch_queue): at CUDA's default the idle probe stalls
        "launch_queue": os.environ.get("CUDA_SCALE_LAUNCH_QUEUES", "default"),
        "params": params,
        "tokens_per_rank": cfg.data.seq_len // run.cp_degree,
        # samples a forward and backward of a data-parallel group: batch_size / --micro-batches
        "micro_batch": cfg.data.batch_size // run.micro_batches,
        # fake: torch's fake process group, collectives move nothing (rank `simulate.rank` of a W-rank job)
        "collectives": "fake" if run.simulate_world else "real",
        "simulate": {"world": run.simulate_world, "rank": run.simulate_rank} if run.simulate_world else None,
        "simulate_world": run.simulate_world,
        "compile": {"enabled": run.compile, "mode": run.compile_mode if run.compile else None,
                    "backend": run.compile_backend if run.compile else None,
                    "scope": run.compile_scope if run.compile else None},
        # activation checkpointing: the mode, the blocks it covers, hardware FLOPs / model FLOPs (recompute)
        "checkpointing": checkpointing_header(cfg),
        # --lora-rank: adapters on the named linears, the base frozen; MFU counts LoRA's own training FLOPs
        "lora": lora_header(cfg),
        # --fp8: the blocks' token linears in float8 (torchao; a LoRA base: train/fp8.py); MFU against the bf16 peak
        "fp8": ({"recipe": run.fp8, "mfu_peak": "bf16 dense"}
                | ({"base": "frozen, cast to float8 once (FrozenFloat8Linear)"} if run.lora_rank else {})
                if run.fp8 != "none" else None),
        "step_graph": run.step_graph,  # the whole step replayed from one CUDA graph after warm-up (train/step_graph.py)
        # regions would split compiled graphs: off under --compile; the bare loop has none
        "op_regions": run.timing and not run.compile and run.harness == "lightning",
        # where the ledger records: the instrumented steps (every --regions-every'th, out of step_ms); summaries
        # without this field recorded it in every step, its host time in step_ms (flux_cp/measure/ledger.py)
        "ledger_steps": "instrumented" if run.ledger else None,
    }


def filter_keys(cfg, header: dict) -> dict:
    """A run's configuration in the few top-level keys runs are filtered and grouped by (wandb's run table)."""
    run = cfg.run
    return {"W": run.world_size, "cp": run.cp, "dp": run.dp, "cp_degree": run.cp_degree or run.world_size,
            "weights": run.weights, "compile": run.compile, "step_graph": run.step_graph,
            "batch": run.dp * cfg.data.batch_size, "S": cfg.data.seq_len, "harness": run.harness,
            "precision": run.precision, "device": header["env"].get("device"), "simulated": bool(run.simulate_world),
            "lora_rank": run.lora_rank, "trainable_params": (header.get("lora") or {}).get("trainable_params",
                                                                                            header.get("params"))}


def run_tags(cfg) -> list[str]:
    """wandb tags for what changes a step's work beyond its parallel layout: LoRA (its rank), recompute, float8."""
    run = cfg.run
    tags = [f"lora-r{run.lora_rank}"] if run.lora_rank else ["full-finetune"]
    tags += [f"ac-{run.checkpointing}"] if run.checkpointing != "none" else []
    return tags + ([f"fp8-{run.fp8}"] if run.fp8 != "none" else [])
