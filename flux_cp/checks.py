"""Settings checked before any process starts: `auto` filled in, the combination validated, bad input refused
with one line naming the setting and the fix (ConfigError; the entry point exits with code 2).

    cfg = resolve(parse_config(argv), cuda_available=..., gpu_count=...)
"""

import importlib.util
import os

from flux_cp.config import DDP_WEIGHTS, HEAD_SHARDING, BenchConfig, ConfigError, DataConfig, ModelConfig, RunConfig

MAX_HOST_SLOWDOWN = 16  # --host-slowdown: at most 15 busy loops on the run's core


def resolve(
    cfg: BenchConfig, *, cuda_available: bool, gpu_count: int, env: dict[str, str] | None = None
) -> BenchConfig:
    """Fill `auto` settings and check the combination, before any process is spawned."""
    run, model, data = cfg.run, cfg.model, cfg.data
    if run.accelerator == "auto":
        run.accelerator = "gpu" if cuda_available else "cpu"
    if run.accelerator == "gpu" and not cuda_available:
        raise ConfigError("--accelerator gpu: no CUDA device is visible (use --accelerator cpu)")
    if run.devices < 1:
        raise ConfigError(f"--devices {run.devices}: must be >= 1")
    if run.accelerator == "gpu" and run.devices > gpu_count:
        raise ConfigError(f"--devices {run.devices}: only {gpu_count} GPU(s) visible (use --devices <= {gpu_count})")
    check_nodes(run, os.environ if env is None else env)
    check_dims(model, data)
    if not run.ops_only:
        _check_simulation(run)
    if run.contention or run.contention_ctas != RunConfig.contention_ctas:
        _check_contention(run)
    ranks = run.world_size
    if run.cp_degree is None:
        run.cp_degree = ranks  # pure CP, as with one node
    if run.cp_degree < 1 or ranks % run.cp_degree:
        raise ConfigError(
            f"--cp-degree {run.cp_degree}: must divide the {ranks} ranks (--devices {run.devices} x --num-nodes "
            f"{run.num_nodes} = data-parallel degree x CP degree: pick one of "
            f"{[k for k in range(1, ranks + 1) if ranks % k == 0]})"
        )
    if run.ops_only:
        return _resolve_ops(cfg)
    sim = run.simulate_world
    if run.cp == "auto":
        run.cp = "none" if run.cp_degree == 1 else ("torch" if run.accelerator == "gpu" else "allgather-kv")
    if run.cp == "torch" and run.accelerator != "gpu":
        raise ConfigError(
            "--cp torch: torch's context_parallel intercepts only CUDA SDPA kernels "
            "(use --cp allgather-kv on CPU, or run on a GPU)"
        )
    if run.accelerator == "gpu" and run.precision != "bf16-true" and run.cp in ("torch", "allgather-kv"):
        # These strategies pin flash under auto (cuDNN faults under them on torch 2.11), and flash has no fp32/fp64
        # kernel: the next exact one instead.
        exact = "efficient" if run.precision == "32-true" else "math"
        if run.sdpa_backend == "auto":
            run.sdpa_backend = exact
        elif run.sdpa_backend == "flash":
            raise ConfigError(f"--sdpa-backend flash: no {run.precision} kernel on the GPU (use --precision bf16-true, "
                              f"or --sdpa-backend {exact})")
    if run.cp == "none" and run.cp_degree > 1:
        raise ConfigError(
            f"--cp none: no context parallelism across a CP group of {run.cp_degree} ranks (use --cp-degree 1)"
        )
    if data.global_batch is not None:
        if data.global_batch < 1 or data.global_batch % run.dp:
            raise ConfigError(
                f"--data.global_batch {data.global_batch}: each of the {run.dp} data-parallel groups (ranks / "
                f"--cp-degree) trains an equal share: use a multiple of {run.dp}, or another --cp-degree"
            )
        data.batch_size = data.global_batch // run.dp
    _check_accumulation(run, data)
    _check_fp8(run)
    check_lora(run, model)
    if (run.lora_rank and run.accelerator == "gpu" and run.precision == "bf16-true" and run.sdpa_backend == "auto"
            and run.cp not in ("torch", "allgather-kv")):  # (those pin flash themselves: their `auto` stays the user's)
        # cuDNN's attention, torch's pick, failed under LoRA on torch 2.11 (H100, 2026-12-07: an illegal memory access
        # in Flux.1's first step; cuDNN's mha_graph.execute on 2 + 4 blocks): flash, as the ring pins it
        run.sdpa_backend = "flash"
    if run.cp == "tp" and (run.weights != "ddp" or run.split_conditioning):
        # ZeRO and FSDP would treat each rank's weight shards as copies of one parameter
        what = f"--weights {run.weights}" if run.weights != "ddp" else "--split-conditioning"
        raise ConfigError(f"--cp tp: its weights are sharded by heads and MLP features, the rest replicated under "
                          f"DDP; {what} does not combine with it (use --weights ddp, without --split-conditioning)")
    if run.steps < 1 or run.warmup_steps < 0:
        raise ConfigError(f"--steps {run.steps} --warmup-steps {run.warmup_steps}: need steps >= 1, warmup >= 0")
    if run.timeout_s <= 0:
        raise ConfigError(f"--timeout-s {run.timeout_s}: must be > 0 seconds")
    if not 0 < run.checkpoint_fraction <= 1:  # NaN fails too
        raise ConfigError(f"--checkpoint-fraction {run.checkpoint_fraction:g}: a share of the blocks in (0, 1] "
                          "(0.5: the first half checkpointed)")
    if run.checkpoint_fraction != 1 and run.checkpointing == "none":
        raise ConfigError(f"--checkpoint-fraction {run.checkpoint_fraction:g}: with --checkpointing none it covers "
                          "nothing (add --checkpointing full or selective)")
    if not 0 < run.lr < float("inf"):  # NaN fails too
        raise ConfigError(f"--lr {run.lr:g}: AdamW's learning rate must be > 0 (e.g. 1e-4)")
    if run.compile and run.warmup_steps < 2:
        raise ConfigError(
            f"--warmup-steps {run.warmup_steps}: --compile compiles (and may recompile) in warm-up; use >= 2"
        )
    if run.step_graph:
        _check_step_graph(run)
    if run.profile and run.profile_steps < 1:
        raise ConfigError(f"--profile-steps {run.profile_steps}: must be >= 1 (extra steps after warm-up)")
    if run.num_workers is None:
        run.num_workers = 4 if run.accelerator == "gpu" and run.loader == "workers" else 0
    if run.num_workers < 0:
        raise ConfigError(f"--num-workers {run.num_workers}: must be >= 0 (0: batches made in the main process)")
    if run.num_workers and run.loader != "workers":
        raise ConfigError(f"--num-workers {run.num_workers}: worker processes make batches with --loader workers only "
                          "(add it, or drop --num-workers)")
    if not 1 <= run.host_slowdown <= MAX_HOST_SLOWDOWN:  # NaN fails too
        raise ConfigError(f"--host-slowdown {run.host_slowdown:g}: a number from 1 to {MAX_HOST_SLOWDOWN} (1: the host "
                          "as it is; K, e.g. 1.5: ~1/K of one core)")
    if run.host_slowdown > 1 and (run.devices > 1 or run.num_nodes > 1):
        raise ConfigError(f"--host-slowdown {run.host_slowdown:g}: emulated for one process (--devices 1, or "
                          f"--simulate-world W for a rank of W); drop it to run {run.devices} processes")
    if run.host_slowdown > 1 and run.accelerator == "cpu" and (n := cpu_threads(run)) > 1:
        raise ConfigError(f"--host-slowdown {run.host_slowdown:g}: this CPU run computes on {n} threads, which a core "
                          "shared with busy loops cannot slow in step (measured: 1.5 gave 3x-64x); run it with "
                          "OMP_NUM_THREADS=1 (a GPU run's host is one thread)")
    if run.sigterm_every < 1:
        raise ConfigError(f"--sigterm-every {run.sigterm_every}: a number of steps >= 1 (1: Lightning's every step)")
    if run.interleave_bare < 0 or run.interleave_bare == 1:
        raise ConfigError(f"--interleave-bare {run.interleave_bare}: 0 (off) or blocks of >= 2 steps (a block's "
                          "first step is left out)")
    if run.interleave_bare and (run.harness != "lightning" or run.weights not in DDP_WEIGHTS):
        raise ConfigError(f"--interleave-bare {run.interleave_bare}: a bare twin inside a Lightning run of DDP or "
                          f"ZeRO weights (not --harness {run.harness} --weights {run.weights}; drop it)")
    if run.zero_bucket_view and run.weights != "zero":
        raise ConfigError(f"--zero-bucket-view true: ZeRO's flat parameter buffers need --weights zero (not "
                          f"{run.weights}; or drop --zero-bucket-view)")
    if run.grad_bucket_view and run.weights not in DDP_WEIGHTS:
        raise ConfigError(f"--grad-bucket-view true: gradients in DDP's all-reduce buckets need --weights ddp or zero "
                          f"(--weights {run.weights} keeps its own; or drop --grad-bucket-view)")
    if run.zero2_gather != "backward" and run.weights != "zero2":
        raise ConfigError(f"--zero2-gather {run.zero2_gather}: where ZeRO-2 gathers its parameters needs --weights "
                          f"zero2 (not {run.weights}; or drop --zero2-gather)")
    if run.zero2_bucket_mb <= 0 or (run.zero2_bucket_mb != RunConfig.zero2_bucket_mb and run.weights != "zero2"):
        raise ConfigError(f"--zero2-bucket-mb {run.zero2_bucket_mb}: the size of ZeRO-2's buckets, > 0, with --weights "
                          "zero2 (add it, or drop the size)")
    _check_fsdp(run, model)
    if not 0 < run.zero2_forward_share <= 1 or (run.zero2_forward_share != 1 and run.zero2_gather != "forward"):
        raise ConfigError(f"--zero2-forward-share {run.zero2_forward_share}: the share of ZeRO-2's buckets gathered "
                          "under the forward, in (0, 1], with --zero2-gather forward (add it, or drop the share)")
    if run.ulysses_overlap and (run.cp != "ulysses" or run.ulysses_qkv != "fused"):
        raise ConfigError(f"--ulysses-overlap true: overlaps Ulysses' fused q/k/v all-to-all with the MLP (not --cp "
                          f"{run.cp} --ulysses-qkv {run.ulysses_qkv}): use --cp ulysses --ulysses-qkv fused, or "
                          "drop it")
    if run.harness == "bare":
        _check_bare(run)
    if run.sync_debug and run.accelerator != "gpu":
        raise ConfigError("--sync-debug: torch's sync debug mode watches CUDA calls (drop it, or run on a GPU)")
    if run.gc_every < 0:
        raise ConfigError(f"--gc-every {run.gc_every}: 0 (Python's automatic collection) or a number of steps >= 1")
    if run.regions_every < 1:
        raise ConfigError(f"--regions-every {run.regions_every}: >= 1 (1: op regions in every measured step)")
    if run.idle_probe_every == 1 or run.idle_probe_every < 0:
        raise ConfigError(f"--idle-probe-every {run.idle_probe_every}: 0 (off) or >= 2")
    w = run.cp_degree
    where = "--simulate-world" if sim and run.cp_degree == ranks else "--cp-degree" if sim else None
    what = f"--simulate-world {sim}" if where == "--simulate-world" else f"the CP degree {w}"  # the setting to change
    sizes = (("data.image_height * data.image_width", data.image_tokens), ("data.text_tokens", data.text_tokens))
    for name, n in sizes:
        if n % w:
            raise ConfigError(
                f"{name} = {n} is not divisible by {what} (image and text tokens are sharded "
                f"separately: pick sizes divisible by {w}, or another {where or '--devices / --cp-degree'})"
            )
    _check_heads(model, run.cp, w, what, f"use a {where or '--cp-degree'}")
    if run.cp == "tp" and int(model.hidden * model.mlp_ratio) % w:
        raise ConfigError(f"--model.mlp_ratio {model.mlp_ratio}: the MLP's {int(model.hidden * model.mlp_ratio)} "
                          f"features are not divisible by {what}, which --cp tp shards (pick a ratio or a W dividing "
                          "them)")
    _check_ring_kernel(run, data.seq_len, w, what)
    if run.split_conditioning and (2 * model.hidden) % w + (3 * model.hidden) % w:
        raise ConfigError(
            f"--split-conditioning: the modulation linears' widths (2, 3 and 6 x hidden {model.hidden}) must divide "
            f"by the CP degree {w} (pick a CP degree dividing {2 * model.hidden} and {3 * model.hidden}, or drop it)"
        )
    return cfg


def _check_step_graph(run: RunConfig) -> None:
    """--step-graph: what one CUDA graph of the whole step can hold (flux_cp/train/step_graph.py)."""
    why = None
    if run.accelerator != "gpu":
        why = "CUDA graphs need a GPU (drop --step-graph on CPU)"
    elif run.compile and run.compile_mode in ("reduce-overhead", "max-autotune"):
        why = (f"{run.compile_mode}'s own CUDA graphs cannot nest in it (use --compile-mode default or "
               "max-autotune-no-cudagraphs, or drop --step-graph)")
    elif run.interleave_bare:
        why = "the bare twin would need a graph of its own (drop --interleave-bare; --harness bare is the twin)"
    elif run.micro_batches > 1:
        why = (f"--micro-batches {run.micro_batches}: one capture of several micro-batches "
               "is not built (drop one of them)")
    elif run.weights == "fsdp":
        why = "FSDP2 frees and gathers its shards from the host each step (use --weights ddp or zero)"
    elif run.warmup_steps < (need := 12 if run.world_size > 1 or run.cp == "torch" else 3):
        # DDP times its first 10 iterations with events it reads on the host (its runtime logger): not in a capture
        why = (f"--warmup-steps {run.warmup_steps}: it captures at the last warm-up step, after eager ones (compile "
               f"compiles; DDP reads its first 10 iterations' timings on the host): use >= {need}")
    if why:
        raise ConfigError(f"--step-graph: {why}")


def _check_fsdp(run: RunConfig, model) -> None:
    """--fsdp-*: FSDP2's tuning, with --weights fsdp only; counts of blocks within the model's."""
    blocks = model.double_blocks + model.single_blocks
    tuned = {"--fsdp-prefetch": run.fsdp_prefetch, "--fsdp-reshard-last": run.fsdp_reshard_last}
    for flag, v in tuned.items():
        if not 0 <= v <= blocks:
            raise ConfigError(f"{flag} {v}: a count of blocks in [0, {blocks}] (the model's {blocks} blocks)")
    if run.weights != "fsdp":
        for flag, v in (*tuned.items(), ("--fsdp-reduce-dtype", run.fsdp_reduce_dtype),
                        ("--fsdp-cpu-offload", run.fsdp_cpu_offload)):
            if v not in (0, "param", False):
                v = str(v).lower() if isinstance(v, bool) else v
                raise ConfigError(f"{flag} {v}: tunes FSDP2, needs --weights fsdp (not {run.weights}; or drop {flag})")


def _check_fp8(run: RunConfig) -> None:
    """--fp8: torchao's float8 GEMMs need an H100-class GPU (a CPU would emulate them: no figure worth taking)."""
    if run.fsdp_fp8_all_gather and (run.fp8 != "tensorwise" or run.weights != "fsdp" or run.lora_rank):
        raise ConfigError(f"--fsdp-fp8-all-gather true: gathers the float8 linears' weights in float8 under FSDP2, one "
                          f"scale a tensor: needs --fp8 tensorwise --weights fsdp without LoRA (not --fp8 {run.fp8} "
                          f"--weights {run.weights}{' --lora-rank ' + str(run.lora_rank) if run.lora_rank else ''}; "
                          "or drop it)")
    if run.fsdp_fp8_all_gather and run.fsdp_cpu_offload:
        raise ConfigError("--fsdp-fp8-all-gather true: casts each weight on its shard, which --fsdp-cpu-offload keeps "
                          "in host memory (the casts would run on the CPU): drop one of them")
    if run.fp8 == "none":
        return
    if run.accelerator != "gpu":
        raise ConfigError(f"--fp8 {run.fp8}: float8 GEMMs need a GPU with FP8 tensor cores (H100 or newer); drop it on "
                          "a CPU")
    if run.precision != "bf16-true":
        raise ConfigError(f"--fp8 {run.fp8}: float8 linears train beside bf16 weights (use --precision bf16-true)")
    if run.cp == "tp":
        raise ConfigError("--fp8 with --cp tp: the TP linears are this tool's own sharded modules, which torchao's "
                          "float8 conversion does not know (use --cp ulysses, torch, allgather-kv or none)")
    if run.ulysses_overlap:  # parallel/ulysses_overlap.py multiplies by proj_out's weight itself, in bf16
        raise ConfigError(f"--fp8 {run.fp8} with --ulysses-overlap true: the overlap splits proj_out's weight and "
                          "multiplies by it itself, so proj_out would stay bf16 (drop one of them)")


def check_installed(run: RunConfig) -> None:
    """What this machine must have for the run (apart from the settings' own checks in resolve, which a sweep also
    runs for the device a suite is meant for): torchao for --fp8 where weights train."""
    if run.fp8 != "none" and not run.lora_rank and importlib.util.find_spec("torchao") is None:  # LoRA: our own
        raise ConfigError(f"--fp8 {run.fp8}: torchao's float8 training is not installed (pip install -e '.[fp8]')")


def check_lora(run: RunConfig, model: ModelConfig) -> None:
    """--lora-*: a rank >= 0; alpha and targets only with a rank; targets the model has; what LoRA does not combine
    with, refused with why."""
    from flux_cp.lora import lora_modules

    if run.lora_rank < 0:
        raise ConfigError(f"--lora-rank {run.lora_rank}: the adapters' rank, >= 1 (0: full fine-tuning, no adapters)")
    if not run.lora_rank:
        for flag, v, default in (("--lora-alpha", run.lora_alpha, None), ("--lora-targets", run.lora_targets,
                                                                            "attention")):
            if v != default:
                raise ConfigError(f"{flag} {v}: sets LoRA's adapters, needs --lora-rank r >= 1 (or drop {flag})")
        return
    if run.lora_alpha is not None and not run.lora_alpha > 0:  # NaN fails too
        raise ConfigError(f"--lora-alpha {run.lora_alpha:g}: the adapters' scale numerator, > 0 (default: the rank)")
    adapted = lora_modules(model, run.lora_targets)  # one line for a name the model lacks
    if run.cp == "tp":
        raise ConfigError("--lora-rank with --cp tp: the adapters would have to be sharded with their base layer, "
                          "which this tool's TP does not do (use --cp ulysses, torch, allgather-kv or none)")
    if run.fp8 != "none" and run.weights == "fsdp":
        raise ConfigError(f"--lora-rank with --fp8 {run.fp8} under --weights fsdp: the frozen base is cast to float8 "
                          "once and kept whole on each rank, where FSDP2 shards it (use --weights ddp, zero or zero2)")
    if run.ulysses_overlap and any(lin.name.endswith("proj_out") for lin in adapted):
        raise ConfigError("--ulysses-overlap with an adapter on proj_out: the overlap splits proj_out's weight "
                          "itself and would skip the adapter (drop proj_out from --lora-targets, or the overlap)")


def _check_accumulation(run: RunConfig, data: DataConfig) -> None:
    """--micro-batches k: a data-parallel group's samples a step in k equal micro-batches."""
    k, b = run.micro_batches, data.batch_size
    if k < 1 or b % k:
        raise ConfigError(f"--micro-batches {k}: splits each data-parallel group's {b} samples a step "
                          f"(--data.batch_size, or --data.global_batch / dp) into k equal micro-batches: use one of "
                          f"{[d for d in range(1, b + 1) if b % d == 0]}")


# Settings of the Lightning harness that the bare loop (one event pair per step, nothing else) has no use for
LIGHTNING_ONLY = {"profile": False, "sync_debug": False, "gc_every": 0, "dump_ops": False, "loader": "device"}


def _check_bare(run: RunConfig) -> None:
    for key, default in LIGHTNING_ONLY.items():
        if getattr(run, key) != default:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(run, key)}: a setting of the Lightning harness; --harness bare times "
                              f"whole steps only (drop {flag}, or use --harness lightning)")


def cpu_threads(run: RunConfig) -> int:
    """Threads a CPU rank computes on: OMP_NUM_THREADS, else the cores shared out over the ranks (as Lightning's
    launcher and the bare loop set them)."""
    import os

    if (given := os.environ.get("OMP_NUM_THREADS", "")).isdigit():
        return int(given)
    return max(1, (os.cpu_count() or 1) // run.devices)


def check_dims(model: ModelConfig, data: DataConfig) -> None:
    """Dimensions the model and the batches can be built with (checked before any process starts)."""
    positive = {"num_heads": model.num_heads, "in_channels": model.in_channels, "text_dim": model.text_dim,
                "pooled_dim": model.pooled_dim}
    for key, v in positive.items():
        if v < 1:
            raise ConfigError(f"--model.{key} {v}: must be >= 1")
    if model.head_dim < 6 or model.head_dim % 2:
        raise ConfigError(f"--model.head_dim {model.head_dim}: must be even and >= 6 (three RoPE axes rotate pairs "
                          "of channels)")
    if model.mlp_ratio <= 0 or int(model.hidden * model.mlp_ratio) < 1:
        raise ConfigError(f"--model.mlp_ratio {model.mlp_ratio}: must be > 0")
    if model.double_blocks < 0 or model.single_blocks < 0 or model.double_blocks + model.single_blocks < 1:
        raise ConfigError(f"--model.double_blocks {model.double_blocks} --model.single_blocks {model.single_blocks}: "
                          "need >= 0 of each and at least one block")
    axes = model.rope_axes
    if len(axes) != 3 or min(axes) < 2 or sum(axes) != model.head_dim or any(a % 2 for a in axes):
        raise ConfigError(f"--model.rope_axes {axes}: three even sizes (text/index, row, col) summing to head_dim "
                          f"{model.head_dim}, e.g. {_rope_example(model.head_dim)}")
    for key in ("image_height", "image_width", "text_tokens", "batch_size"):
        if getattr(data, key) < 1:
            raise ConfigError(f"--data.{key} {getattr(data, key)}: must be >= 1")


def _rope_example(head_dim: int) -> list[int]:
    """Flux's split (16, 56, 56 of 128) scaled to head_dim, kept even."""
    a = max(2, 2 * round(head_dim / 16))
    b = 2 * ((head_dim - a) // 4)
    return [head_dim - 2 * b, b, b]


def _check_simulation(run: RunConfig) -> None:
    """--simulate-world W: one process, rank --simulate-rank of a W-rank job (checked before anything starts)."""
    sim = run.simulate_world
    if sim is None:
        if run.simulate_rank:
            raise ConfigError(f"--simulate-rank {run.simulate_rank}: needs --simulate-world W (the job's size)")
        return
    if not isinstance(sim, int):
        raise ConfigError(f"--simulate-world {sim}: training takes one W (lists are for --ops-only)")
    if sim < 2:
        raise ConfigError(f"--simulate-world {sim}: a simulated job has W >= 2 ranks (drop it to run one real process)")
    if run.devices * run.num_nodes != 1:
        raise ConfigError(
            f"--simulate-world {sim}: this one process is a rank of the simulated job (drop --devices {run.devices}"
            f"{f' --num-nodes {run.num_nodes}' if run.num_nodes > 1 else ''}, or drop --simulate-world to run them)"
        )
    if not 0 <= run.simulate_rank < sim:
        raise ConfigError(f"--simulate-rank {run.simulate_rank}: ranks of --simulate-world {sim} run 0..{sim - 1}")


def _check_contention(run: RunConfig) -> None:
    """--contention: a simulated rank's collectives put on its GPU as traffic (flux_cp/parallel/contention.py; its
    Triton kernel: CUDA builds of torch ship Triton)."""
    why = None
    if not run.contention:
        why = (f"--contention-ctas {run.contention_ctas}: the size of --contention's traffic kernels (add --contention "
               "true, or drop it)")
    elif run.ops_only:
        why = "--contention: traffic beside a training step, not the op bench (drop --ops-only or --contention)"
    elif run.accelerator != "gpu":
        why = ("--contention: a simulated rank's collectives put on its GPU as traffic, and there is no GPU here "
               "(drop --contention, or run with --accelerator gpu)")
    elif not run.simulate_world:
        why = ("--contention: puts a simulated rank's collectives on its GPU; real ranks' NCCL kernels are that "
               "traffic already (add --simulate-world W, or drop --contention)")
    elif not 1 <= run.contention_ctas <= 1024:
        why = f"--contention-ctas {run.contention_ctas}: CTAs of each traffic kernel, 1..1024 (NCCL's ~16-32)"
    if why:
        raise ConfigError(why)


def _check_heads(model: ModelConfig, cp: str, w: int, what: str, fix: str) -> None:
    """Head-sharding strategies need heads divisible by the split."""
    if cp in HEAD_SHARDING and model.num_heads % w:
        raise ConfigError(
            f"--model.num_heads {model.num_heads} is not divisible by {what}, which --cp {cp} needs "
            f"(it shards heads: {fix} dividing {model.num_heads}, or --cp allgather-kv)"
        )


def _check_ring_kernel(run: RunConfig, seq: int, w: int, what: str) -> None:
    """torch's ring merges its chunks by their logsumexp, which the memory-efficient kernel pads to a multiple of
    32 rows: any other per-rank length fails inside the ring at W >= 2 ("size of tensor a (64) must match ... (36)")."""
    per_rank = seq // w
    if w > 1 and run.cp == "torch" and run.accelerator == "gpu" and run.sdpa_backend == "efficient" and per_rank % 32:
        raise ConfigError(
            f"--cp torch with the memory-efficient SDPA kernel ({run.precision}): {per_rank} tokens per rank for "
            f"{what}; torch's ring needs a multiple of 32 with that kernel (use --precision bf16-true for flash, "
            f"or a sequence whose per-rank share divides by 32)"
        )


def check_nodes(run: RunConfig, env) -> None:
    """The node count must agree with the launcher that started us (torchrun, SLURM, NODE_RANK)."""
    if run.num_nodes < 1:
        raise ConfigError(f"--num-nodes {run.num_nodes}: must be >= 1")
    for var in ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID"):  # Lightning / torchrun / SLURM name for it
        if var in env and not 0 <= int(env[var]) < run.num_nodes:
            raise ConfigError(
                f"--num-nodes {run.num_nodes}: this node has {var}={env[var]}, node ranks run 0..{run.num_nodes - 1}"
                " (set --num-nodes to the number of nodes launched)"
            )
    if "TORCHELASTIC_RUN_ID" in env and int(env.get("WORLD_SIZE", run.world_size)) != run.world_size:
        raise ConfigError(
            f"--num-nodes {run.num_nodes} x --devices {run.devices} = {run.world_size} ranks, but torchrun started "
            f"WORLD_SIZE={env['WORLD_SIZE']} (use --num-nodes = --nnodes and --devices = --nproc-per-node)"
        )
    if "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):  # as Lightning detects it
        if int(env.get("SLURM_NNODES", run.num_nodes)) != run.num_nodes:
            raise ConfigError(
                f"--num-nodes {run.num_nodes}: the SLURM job has SLURM_NNODES={env['SLURM_NNODES']} (use --num-nodes "
                f"{env['SLURM_NNODES']}, and --devices = --ntasks-per-node)"
            )


def _int_list(flag: str, value) -> list[int] | None:
    """`4`, `[2, 4]` or "2,4,8" -> [2, 4, 8]; a one-line ConfigError otherwise."""
    if value is None or isinstance(value, list) and all(isinstance(v, int) for v in value):
        return value
    if isinstance(value, int):
        return [value]
    try:
        out = [int(v) for v in str(value).split(",")]
    except ValueError:
        raise ConfigError(f"{flag} {value}: expected comma-separated integers, e.g. {flag} 4608,16384") from None
    if not out or min(out) < 1:
        raise ConfigError(f"{flag} {value}: values must be >= 1")
    return out


def split_seq_len(seq_len: int, data: DataConfig) -> tuple[int, int]:
    """(image, text) tokens of a total length: text stays the config's text_tokens (T5's fixed length)."""
    return seq_len - data.text_tokens, data.text_tokens


def _resolve_ops(cfg: BenchConfig) -> BenchConfig:
    """Checks of --ops-only: per-rank shapes of each seq len for each (simulated) world size."""
    run, model, data = cfg.run, cfg.model, cfg.data
    if run.harness == "bare":
        raise ConfigError("--harness bare: the op bench has no harness around its calls (drop --harness or --ops-only)")
    run.seq_lens = _int_list("--seq-lens", run.seq_lens) or [data.seq_len]
    sims = _int_list("--simulate-world", run.simulate_world)
    run.simulate_world = None if sims == [1] else sims  # 1 alone (the default): no simulation
    sim = run.simulate_world is not None
    if sim and run.devices > 1:
        raise ConfigError(f"--simulate-world runs on one process: use --devices 1 (got --devices {run.devices})")
    if run.cp == "auto":
        if sim:
            run.cp = "torch" if run.accelerator == "gpu" else "allgather-kv"
        else:
            run.cp = "none" if run.devices == 1 else ("torch" if run.accelerator == "gpu" else "allgather-kv")
    if run.cp == "torch" and run.accelerator != "gpu":
        raise ConfigError(
            "--cp torch: torch's context_parallel intercepts only CUDA SDPA kernels "
            "(use --cp allgather-kv on CPU, or run on a GPU)"
        )
    if run.cp == "none" and (run.devices > 1 or sim):
        raise ConfigError("--cp none: no split to measure or simulate (use --cp torch, allgather-kv or ulysses)")
    if run.cp == "tp":
        raise ConfigError("--cp tp: its attention is Ulysses' (this rank's heads, the whole sequence) without the "
                          "all-to-alls; the op bench has no TP of its own (use --cp ulysses with --ops-only)")
    if run.graph and run.accelerator != "gpu":
        raise ConfigError("--graph: CUDA graphs need a GPU (drop --graph, or use --accelerator gpu)")
    if run.micro_batches != 1:
        raise ConfigError(f"--micro-batches {run.micro_batches}: the op bench times single calls at --data.batch_size "
                          "(set the batch there, and drop --micro-batches or --ops-only)")
    if run.reps is not None and run.reps < 1:
        raise ConfigError(f"--reps {run.reps}: must be >= 1")
    for w in run.simulate_world or [run.devices]:
        for s in run.seq_lens:
            image, text = split_seq_len(s, data)
            if image < 1:
                raise ConfigError(f"--seq-lens {s}: shorter than the text tokens (data.text_tokens {text}) plus one "
                                  f"image token: use lengths > {text}")
            if image % w or text % w:
                raise ConfigError(
                    f"--seq-lens {s}: {image} image + {text} text tokens (data.text_tokens) do not both divide by "
                    f"W = {w} (they are sharded separately: pick a length whose image part divides by {w})"
                )
        _check_heads(model, run.cp, w, f"W = {w}", "pick W")
        for s in run.seq_lens:
            _check_ring_kernel(run, s, w, f"W = {w} at --seq-lens {s}")
    return cfg
