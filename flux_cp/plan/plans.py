"""The plans for one cell (a model, a sequence length S, a global batch B, W GPUs): every way this tool can spend the
W GPUs on B samples, and why each one left out is left out.

    plans = enumerate_plans(cfg, seq_len=4608, global_batch=8, world=8, builds=("eager", "graph"), memory_gib=80)
    [p.name for p in plans if p.pruned is None]     # what scripts/plan.py runs, each as rank 0 over the fake group

A plan: W = dp x cp (dp data-parallel groups, each of cp ranks sharing its samples' tokens or weights); within a group
`cp` in none (cp = 1: plain data parallelism, the baseline to beat), torch (ring), allgather-kv, ulysses, tp;
weights kept in sync by ddp, zero2 (zero2f: its gathers under the next forward) or fsdp (fsdpoff: its shards, gradients
and AdamW state in host memory, planned only where fsdp does not fit, W = 1 included); eager, compiled per block
(GPU), or compiled per block with the whole step replayed from one CUDA graph (graph; GPU). Each data-parallel
group trains B / dp samples a step.
A plan is pruned, with its reason, where the settings are refused (checks.resolve: the same one-line errors a run
gives) or where its estimated peak memory exceeds the device's even with gradient accumulation: a plan whose B / dp
samples do not fit runs them as the fewest equal micro-batches that do (--micro-batches k, named -acc<k>; the step
graph takes none).
"""

import copy
from dataclasses import dataclass, field

from flux_cp.checks import resolve, split_seq_len
from flux_cp.config import BenchConfig, ConfigError, config_from_summary

CP_KINDS = ("none", "torch", "allgather-kv", "ulysses", "tp")
WEIGHTS = ("ddp", "zero2", "zero2f", "fsdp", "fsdpoff")
# zero2f: ZeRO-2 with each bucket's parameter all-gather under the next step's forward (--zero2-gather forward, as
# FSDP prefetches), not under the backward that reduced it: where a short (compiled, graphed) backward cannot hide
# both the reduce-scatters and the gathers
WEIGHT_SETTINGS = {"ddp": {"weights": "ddp"}, "zero2": {"weights": "zero2"},
                   "zero2f": {"weights": "zero2", "zero2_gather": "forward"}, "fsdp": {"weights": "fsdp"},
                   "fsdpoff": {"weights": "fsdp", "fsdp_cpu_offload": True}}
# compiled: per block, no step graph (FSDP2's hooks and torchao's FP8 keep a step out of one graph: Flux.1's best plans)
BUILDS = {"eager": {}, "compiled": {"compile": True}, "graph": {"compile": True, "step_graph": True}}
GRAPH_WARMUP = 12  # the step graph captures at the last warm-up step, after compiling (checks._check_step_graph)
@dataclass(frozen=True)
class ActivationUnits:
    """Activation bytes a token keeps per block for the backward, in units of hidden x the parameter dtype's size, by
    what the run keeps: a device's kernels decide them, so they are fitted on its measured peaks (a CPU's eager
    kernels keep more: tests/test_memory_estimate.py fits its own on the tiny model's live tensors)."""

    none: float
    selective: float  # the GEMMs' and attention's outputs kept, the elementwise ops recomputed
    full: float  # each block's input; the block being recomputed holds `none` meanwhile
    lora_none: float  # a frozen linear keeps no input for a weight gradient
    lora_selective: float
    fp8_none: float  # torchao keeps the linears' inputs cast to float8 (with selective: bf16's)

    def of(self, checkpointing: str, lora: bool, fp8: bool) -> float:
        if checkpointing == "full":
            return self.full
        if lora:
            return self.lora_selective if checkpointing == "selective" else self.lora_none
        if fp8 and checkpointing == "none":
            return self.fp8_none
        return self.selective if checkpointing == "selective" else self.none


# Fitted on Flux.1's depth (19 + 38 blocks, H100, bf16): none from FSDP over 8 at 4608 tokens, batch 1 (40.2 GiB peak;
# the 2 + 4-block fit gave 9.0 and let ZeRO-2 plans run out of memory at that depth); selective and full from 1-4
# samples a rank (2026-12-07 [P]: selective 16.1 GiB a sample, refit with FSDP's gathered blocks and gradients
# (docs/results/2026-12-07j); full keeps each block's input);
# LoRA from rank 64 on attention, 1-2 samples a rank, W = 1-8 (2026-12-07d: the MLPs' and single blocks' output
# projections keep no input, ~7 units; selective keeps its matmul outputs whether or not a frozen layer needed
# them: no saving); FP8 without checkpointing from rowwise at B = W = 8 (a byte where bf16 keeps two; 73.1 GiB both
# with selective at four samples a rank). Only for pruning; the ranked table shows measured peaks.
H100_UNITS = ActivationUnits(none=19.4, selective=10.7, full=1.0, lora_none=12.5, lora_selective=13.0, fp8_none=14.9)
CHECKPOINTING = ("none", "selective", "full")
# the --fp8 axis: each value's run settings (tensorwise-ag8: FSDP2 gathers the float8 weights in float8,
# --fsdp-fp8-all-gather; FSDP plans only, the others left out by its check)
FP8_SETTINGS = {"none": {}, "tensorwise": {"fp8": "tensorwise"}, "rowwise": {"fp8": "rowwise"},
                "tensorwise-ag8": {"fp8": "tensorwise", "fsdp_fp8_all_gather": True}}
FP8 = tuple(FP8_SETTINGS)
HEADROOM = 0.95  # of the device's memory a plan may fill: the CUDA context and the allocator's fragmentation
BYTES = {"bf16-true": 2, "32-true": 4, "64-true": 8}


@dataclass
class Plan:
    dp: int
    cp_degree: int
    cp: str
    weights: str
    build: str
    settings: dict = field(default_factory=dict)  # train_bench run/data settings (sweep keys)
    pruned: str | None = None  # why it does not run
    memory_gib: float | None = None  # estimated peak a rank
    accumulate: int = 1  # micro-batches a step (--micro-batches), where B / dp samples at once do not fit
    checkpointing: str = "none"  # activation checkpointing (--checkpointing)
    fp8: str = "none"  # FP8 linears (--fp8)

    @property
    def world(self) -> int:
        return self.dp * self.cp_degree

    @property
    def name(self) -> str:
        par = f"dp{self.dp}" if self.cp_degree == 1 else f"dp{self.dp}x{self.cp}{self.cp_degree}"
        ac = "" if self.checkpointing == "none" else f"-ac{self.checkpointing}"
        ac += "" if self.fp8 == "none" else f"-fp8{self.fp8}"
        return f"{par}-{self.weights}-{self.build}{ac}" + (f"-acc{self.accumulate}" if self.accumulate > 1 else "")

    @property
    def baseline(self) -> bool:
        """Plain data parallelism: what a team would pick by default."""
        return self.cp_degree == 1


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def cell_settings(cfg: BenchConfig, seq_len: int, global_batch: int) -> dict:
    """The data settings of a cell: the image tokens of S (the text keeps its length) as a near-square grid."""
    image, _ = split_seq_len(seq_len, cfg.data)
    if image < 1:
        raise ConfigError(f"--seq-len {seq_len}: must exceed the {cfg.data.text_tokens} text tokens")
    width = max(k for k in _divisors(image) if k * k <= image)
    return {"data.image_height": image // width, "data.image_width": width, "data.global_batch": global_batch}


def fit_units(pairs: dict[str, tuple[dict, dict]]) -> ActivationUnits:
    """A device's activation units from its runs' measured peaks: for each of none, selective, full and lora_none,
    the summaries (summary.json) of one run at one sample and one at two, W = 1, otherwise the same. The second
    sample's bytes over a token's unit and the blocks; under full, less the block being recomputed (none's)."""
    fit, blocks = {}, {}
    for mode, (one, two) in pairs.items():
        c = config_from_summary(one["config"])
        blocks[mode] = c.model.double_blocks + c.model.single_blocks
        unit = BYTES[c.run.precision] * c.model.hidden * c.data.seq_len * blocks[mode]
        fit[mode] = (two["memory"]["allocated_gib"] - one["memory"]["allocated_gib"]) * 2**30 / unit
    fit["full"] -= fit["none"] / blocks["full"]
    return ActivationUnits(none=fit["none"], selective=fit["selective"], full=fit["full"], lora_none=fit["lora_none"],
                           lora_selective=fit["lora_none"], fp8_none=fit["none"])


def memory_gib(cfg: BenchConfig, params: int, plan: Plan, units: ActivationUnits = H100_UNITS) -> float:
    """A rank's estimated peak: weights, gradients and AdamW's two moments as each weights mode keeps them, plus the
    activations of its tokens (a W-way share of each sample under CP, Ulysses and TP) in one micro-batch. LoRA
    (--lora-rank): the frozen base without gradients or moments (FSDP still shards it), the adapters as any weights;
    activations as LoRA's measured units (a frozen linear keeps no input for a weight gradient); --fp8 under LoRA
    adds the base's float8 copies."""
    b = BYTES[cfg.run.precision]
    n, W = params, plan.world
    blocks = cfg.model.double_blocks + cfg.model.single_blocks
    trained, frozen = _trained(cfg, n), 0
    grads_with_acts = True  # gradients held while the activations are: in DDP's or ZeRO-2's buckets
    late = 0  # bytes only the end of the backward holds (FSDP's whole gradients before their reduce-scatter)
    if cfg.run.lora_rank:
        frozen = b * n
        if plan.fp8 != "none":  # the frozen base's float8 copies, W and W^T, a byte each (flux_cp/train/fp8.py)
            from flux_cp.train.fp8 import fp8_weights

            frozen += 2 * fp8_weights(cfg.model)
    if plan.cp == "tp":  # the blocks' weights and state sharded by the group; the root's replicated (with DDP's
        # buckets), a share that only a shallow model notices; the gradients (None after each step) fill as the
        # backward frees the activations
        rep = 0 if cfg.run.lora_rank else block_params(cfg)[1]  # (LoRA's adapters: all on sharded layers)
        weights = (frozen + 3 * b * (trained - rep)) / plan.cp_degree + 4 * b * rep
        grads_with_acts, trained = False, (trained - rep) / plan.cp_degree
    elif plan.weights == "ddp":
        # + DDP's gradient buckets, where DDP wraps: one rank alone trains unwrapped unless torch's CP needs its group
        # (flux_cp/train/strategies.py, bare.py)
        buckets = W > 1 or plan.cp == "torch"
        weights = frozen + (4 if buckets else 3) * b * trained
        # the gradients (None after each step) fill as the activations free, beside the buckets (kept from step to
        # step), unless they are views into them (--grad-bucket-view: zeroed in place, held throughout)
        grads_with_acts = buckets and cfg.run.grad_bucket_view
        if grads_with_acts:
            weights -= b * trained
    elif WEIGHT_SETTINGS[plan.weights]["weights"] == "zero2":  # zero2f too: where it gathers, not what it keeps
        weights = frozen + 2 * b * trained + 2 * b * trained / W  # parameters and gradient buckets whole; 1/W moments
    elif plan.weights == "fsdpoff":  # the shards in host memory (host_gib); on the GPU the root's parameters (FSDP2
        # keeps the root gathered), the gathered block with those prefetched, and one block's whole gradients before
        # their reduce-scatter
        block, root = block_params(cfg)
        weights = b * (root + (2 + max(1, cfg.run.fsdp_prefetch)) * block)
    else:  # fsdp: parameters and AdamW's moments sharded; on top the root's parameters (FSDP2 keeps the root
        # gathered) and the block being computed gathered with the one prefetched (none where all are kept whole)
        block, root = block_params(cfg)
        resharded = 1 - cfg.run.fsdp_reshard_last / blocks
        weights = (frozen + 3 * b * trained) / W + b * (root + max(1, cfg.run.fsdp_prefetch) * block * resharded
                                                        ) * (W > 1)
        # the sharded gradients (None after each step) fill as the backward frees the activations, and late in it
        # two blocks' whole gradients wait for their reduce-scatter (the block's, and the last one's until the next
        # is issued): the tiny model's live tensors show it, where a block is a third of the parameters
        grads_with_acts, trained = False, trained / W
        late = 0 if cfg.run.lora_rank or W == 1 else 2 * b * block
        # --fsdp-reshard-last k: the last k blocks' parameters kept whole from their forward to the backward (the
        # float8 linears' in a byte each where they are gathered in float8: --fsdp-fp8-all-gather)
        kept = b * n
        if cfg.run.fsdp_fp8_all_gather:
            from flux_cp.train.fp8 import fp8_weights

            kept -= (b - 1) * fp8_weights(cfg.model)
        weights += kept * (1 - 1 / W) * cfg.run.fsdp_reshard_last / blocks
    tokens = cfg.data.batch_size // cfg.run.micro_batches * cfg.data.seq_len  # a micro-batch's, before any split
    per_token = b * cfg.model.hidden * tokens / plan.cp_degree  # bytes of one unit, a rank's tokens
    unit = units.of(plan.checkpointing, bool(cfg.run.lora_rank), plan.fp8 != "none")
    # the block being computed in the backward holds its whole activations (recomputed, under full checkpointing)
    last = (units.none if plan.checkpointing == "full" else unit) * per_token
    acts = unit * per_token * blocks + (last if plan.checkpointing == "full" else 0)
    if plan.cp == "tp":  # each column-parallel linear keeps its all-gathered input whole, every token (its weight's
        # gradient reads them all): a double block gathers twice (attention, MLP), a single block once
        gathered = 2 * cfg.model.double_blocks + cfg.model.single_blocks
        acts += gathered * b * cfg.model.hidden * tokens
    if not grads_with_acts:  # the backward's peak: the activations still held and the gradients made so far, at
        # most every gradient beside the first block's activations, the last freed
        acts = max(acts, b * trained + late + last)
    return (weights + acts) / 2**30


_BLOCKS: dict[str, tuple[int, int]] = {}  # block_params by model config: a meta build per config, not per plan


def block_params(cfg: BenchConfig) -> tuple[int, int]:
    """(the largest block's parameters, the root's: the embedders, the final norm and projection), counted on the
    meta device."""
    key = repr(cfg.model)
    if key not in _BLOCKS:
        import torch

        from flux_cp.model import FluxDiT, num_params

        with torch.device("meta"):
            model = FluxDiT(cfg.model)
        blocks = [num_params(blk) for blk in (*model.double_blocks, *model.single_blocks)]
        _BLOCKS[key] = (max(blocks, default=0), num_params(model) - sum(blocks))
    return _BLOCKS[key]


def _trained(cfg: BenchConfig, params: int) -> int:
    """The parameters that train: all of them, or LoRA's adapters."""
    if not cfg.run.lora_rank:
        return params
    from flux_cp.lora import adapter_params

    return adapter_params(cfg.model, cfg.run.lora_targets, cfg.run.lora_rank)


def host_gib(cfg: BenchConfig, params: int, plan: Plan) -> float:
    """A rank's host memory under fsdpoff: its shards of the parameters and gradients (pinned) and AdamW's two
    moments, in the parameters' dtype (0 for the other weights modes)."""
    if plan.weights != "fsdpoff":
        return 0.0
    trained = _trained(cfg, params)
    b = BYTES[cfg.run.precision]
    return (b * (params - trained) + 4 * b * trained) / plan.world / 2**30


def weights_mode(run) -> str:
    """The planner's name for a run's weights settings (WEIGHT_SETTINGS read backwards: the most specific first)."""
    return next(m for m, s in reversed(WEIGHT_SETTINGS.items()) if all(getattr(run, k) == v for k, v in s.items()))


def run_memory_gib(summary: dict, units: ActivationUnits = H100_UNITS) -> float:
    """The estimate for the plan a run's summary.json ran (its own settings: tools/memory_check.py, the tests). The
    whole model's parameters, as the planner counts them: a run's own `params` is its rank's (TP's shard; LoRA's
    adapters included)."""
    cfg = config_from_summary(summary["config"])
    run = cfg.run
    world = summary.get("simulate_world") or summary["world_size"]
    plan = Plan(world // run.cp_degree, run.cp_degree, run.cp, weights_mode(run),
                "graph" if run.step_graph else "compiled" if run.compile else "eager",
                checkpointing=run.checkpointing, fp8=run.fp8 + ("-ag8" if run.fsdp_fp8_all_gather else ""))
    return memory_gib(cfg, count_params(cfg), plan, units)


def count_params(cfg: BenchConfig) -> int:
    """The model's parameters, built on the meta device (no memory)."""
    import torch

    from flux_cp.model import FluxDiT, num_params

    with torch.device("meta"):
        return num_params(FluxDiT(cfg.model))


def enumerate_plans(cfg: BenchConfig, seq_len: int, global_batch: int, world: int, *, builds=("eager",),
                    cps=CP_KINDS, weights=WEIGHTS, memory_gib_limit: float | None = None, on_gpu: bool = True,
                    params: int | None = None, checkpointing=("none",), fp8=("none",)) -> list[Plan]:
    """Every plan of the cell, those that cannot run with `pruned` set. cfg: the model config (its run settings are
    the plans' base: precision, steps, ...)."""
    cell = cell_settings(cfg, seq_len, global_batch)
    params = params if params is not None else count_params(cfg)
    out = []
    for c in _divisors(world):
        for cp in cps:
            if (cp == "none") != (c == 1):  # (torch's ring on a CPU: left out by its check, with the reason)
                continue
            for w in weights:
                if world == 1 and w not in ("ddp", "fsdpoff"):  # one rank: nothing to shard or sync (but to offload)
                    continue
                for build, ac, f8 in ((b, a, f) for b in builds for a in checkpointing for f in fp8):
                    p = Plan(world // c, c, cp, w, build, checkpointing=ac, fp8=f8)
                    p.settings = {**cell, "cp": cp, "cp_degree": c, **WEIGHT_SETTINGS[w], **BUILDS[build],
                                  "simulate_world": world if world > 1 else None}
                    if ac != "none":
                        p.settings["checkpointing"] = ac
                    p.settings.update(FP8_SETTINGS[f8])
                    if build == "graph":
                        p.settings["warmup_steps"] = max(GRAPH_WARMUP, cfg.run.warmup_steps)
                    p.pruned, resolved = check_settings(cfg, p.settings, on_gpu)
                    if p.pruned is None:
                        p.memory_gib = memory_gib(resolved, params, p)
                        if memory_gib_limit is not None and p.memory_gib > HEADROOM * memory_gib_limit:
                            _accumulate(cfg, p, params, resolved.data.batch_size, HEADROOM * memory_gib_limit, on_gpu)
                    out.append(p)
    # offloading only where its twin (fsdp; one GPU: ddp) does not fit: else it only adds host copies and a CPU step
    twin = "ddp" if world == 1 else "fsdp"
    fits = {(p.dp, p.cp, p.build, p.checkpointing, p.fp8) for p in out if p.weights == twin and p.pruned is None}
    for p in out:
        if p.weights == "fsdpoff" and p.pruned is None and (p.dp, p.cp, p.build, p.checkpointing, p.fp8) in fits:
            p.pruned = f"{twin} fits: offloading would only add host copies and a CPU optimizer step"
    return out


def unlisted(world: int, cps=CP_KINDS, weights=WEIGHTS) -> dict[str, list[str]]:
    """What no plan of a W = 1 cell can take, by its reason: every CP strategy (no group to share a sample with) and
    every weights mode but DDP (one rank: nothing to shard or sync). {reason: [--cp x, --weights y, ...]}"""
    if world != 1:
        return {}
    out = {}
    if cp := [f"--cp {c}" for c in cps if c != "none"]:
        out["one GPU: no group of ranks to share a sample's tokens (W >= 2)"] = cp
    if w := [f"--weights {x}" for x in weights if x not in ("ddp", "fsdpoff")]:
        out["one GPU: no other rank to shard the weights over or sync them with (W >= 2)"] = w
    return out


def _accumulate(cfg: BenchConfig, p: Plan, params: int, batch: int, limit: float, on_gpu: bool) -> None:
    """A plan over the memory: its `batch` samples a step in the fewest equal micro-batches that fit (the plan then
    accumulates), else pruned with its estimate."""
    for k in _divisors(batch)[1:]:
        settings = {**p.settings, "micro_batches": k}
        why, resolved = check_settings(cfg, settings, on_gpu)
        if why is not None:  # the step graph takes no accumulation
            break
        if (gib := memory_gib(resolved, params, p)) <= limit:
            p.settings, p.accumulate, p.memory_gib = settings, k, gib
            return
    p.pruned = (f"does not fit: ~{p.memory_gib:.0f} GiB a rank estimated, {limit:.1f} GiB usable ({HEADROOM:.0%} of "
                "the device's)")
    if batch > 1:
        p.pruned += " (in micro-batches too)" if why is None else " (the step graph takes no gradient accumulation)"


def check_settings(cfg: BenchConfig, settings: dict, on_gpu: bool) -> tuple[str | None, BenchConfig | None]:
    """The run's own checks: (None, resolved config) or (the one-line reason it is refused, None)."""
    c = copy.deepcopy(cfg)
    for key, value in settings.items():
        if value is None:
            continue
        section, _, leaf = key.rpartition(".")
        setattr(getattr(c, section) if section else c.run, leaf, value)
    c.run.accelerator = "gpu" if on_gpu else "cpu"
    try:
        return None, resolve(c, cuda_available=on_gpu, gpu_count=1, env={})
    except ConfigError as e:
        return str(e), None


def to_sweep(plans: list[Plan], base_args: list[str], out, name: str, timeout_s: float = 600.0,
             steps: int | None = None):
    """The plans that run, as a sweep (flux_cp/runs/sweep.py) of one-process runs into out/<plan name>: each a
    simulated rank of its W (or the plain W=1 step)."""
    from pathlib import Path

    from flux_cp.runs.sweep_config import Run, Sweep, _flag

    out = Path(out)
    runs = []
    for p in plans:
        if p.pruned is not None:
            continue
        args = list(base_args)
        for k, v in p.settings.items():
            if v is not None:
                args += _flag(k, v)
        # the sweep owns its run folders: it reruns only unfinished ones, over what they left
        args += ["--output", str(out / p.name), "--group", name, "--overwrite"]
        shape = {"seq_len": None, "batch": p.settings.get("data.global_batch"), "world": p.world}
        runs.append(Run(p.name, {"plan": p.name}, args, out / p.name, steps or 0, shape, 1))
    return Sweep(name, "(plan)", out, runs, timeout_s)
