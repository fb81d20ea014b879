"""Benchmark settings: dataclasses, loaded from configs/*.yaml and overridden on the command line.

Precedence: dataclass defaults (Flux.1 dims) < --config YAML < command-line flags.
Model and data settings are nested (`--model.num_heads 4`); run settings are top-level flags
(`--devices 2`, `--warmup-steps 3`), with the same names as keys in the YAML file. Checked, and `auto` filled in,
by flux_cp/checks.py (resolve) before any process starts.
"""

import argparse
import dataclasses
import functools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GPU_DEFAULT = CONFIG_DIR / "flux_4608.yaml"
CPU_DEFAULT = CONFIG_DIR / "tiny.yaml"

CP = Literal["auto", "torch", "allgather-kv", "ulysses", "tp", "none"]
STRATEGIES = ("torch", "allgather-kv", "ulysses", "tp", "none")  # tp: tensor + sequence parallelism (parallel/tp.py)
HEAD_SHARDING = ("ulysses", "tp")  # strategies that split heads across the CP group


class ConfigError(ValueError):
    """Bad input: one line naming the setting and the fix. The entry point exits with code 2."""


@dataclass
class ModelConfig:
    """Model dimensions (--model.KEY)"""

    num_heads: int = 24  # attention heads; hidden = num_heads x head_dim
    head_dim: int = 128  # channels per head (even: RoPE rotates pairs)
    mlp_ratio: float = 4.0  # MLP width / hidden
    double_blocks: int = 2  # FluxTransformerBlock (two streams); Flux.1 has 19
    single_blocks: int = 4  # FluxSingleTransformerBlock; Flux.1 has 38
    in_channels: int = 64  # packed latent: 16 VAE channels x 2x2 patch
    text_dim: int = 4096  # T5-XXL embedding width
    pooled_dim: int = 768  # CLIP pooled embedding width
    rope_axes: list[int] = field(default_factory=lambda: [16, 56, 56])  # (text/index, row, col); sums to head_dim
    fuse_qkv: bool = True  # one to_qkv GEMM per stream (diffusers' fuse_projections)

    @property
    def hidden(self) -> int:
        return self.num_heads * self.head_dim


@dataclass
class DataConfig:
    """Synthetic batches (--data.KEY)"""

    image_height: int = 64  # image tokens per column (1024 px / 8 VAE / 2 patch)
    image_width: int = 64  # image tokens per row
    text_tokens: int = 512  # T5 tokens (a fixed length)
    batch_size: int = 1  # samples per CP group (global batch: dp x batch_size)
    # samples per optimizer step over all ranks; set: each data-parallel group trains global_batch / dp of them
    # (it sets batch_size)
    global_batch: int | None = None
    seed: int = 0  # weights' init and batches: the same at every world size and strategy

    @property
    def image_tokens(self) -> int:
        return self.image_height * self.image_width

    @property
    def seq_len(self) -> int:
        return self.image_tokens + self.text_tokens


# The weights modes whose gradients DDP all-reduces (a DDP wrapper); the others (fsdp, zero2) sync their own, with no
# wrapper, and need a process group even at world size 1
DDP_WEIGHTS = ("ddp", "zero")


@dataclass
class RunConfig:
    devices: int = 1  # per node
    num_nodes: int = 1  # Lightning's cluster environments (torchrun, SLURM, NODE_RANK + MASTER_ADDR) join them
    cp_degree: int | None = None  # ranks per CP group; default: all of them (pure CP). dp = ranks / cp_degree
    # how the weights are kept in sync over all ranks: ddp (replicated, gradients all-reduced); zero (the same, AdamW
    # state sharded: ZeRO-1); zero2 (gradients reduce-scattered, AdamW sharded, parameters all-gathered: ZeRO-2);
    # fsdp (FSDP2: parameters sharded)
    weights: Literal["ddp", "zero", "zero2", "fsdp"] = "ddp"
    # --weights zero: parameters as views of one flat buffer per rank (ZeroRedundancyOptimizer's
    # parameters_as_bucket_view): after the step each rank broadcasts its buffer, W broadcasts instead of one per
    # parameter (104 for Flux's 2 + 4 blocks), fewer host calls for the same bytes
    zero_bucket_view: bool = False
    # --weights ddp / zero: each gradient a view into DDP's flat all-reduce bucket (DDP's gradient_as_bucket_view) and
    # zeroed in place, not freed: DDP then copies no gradient into its buckets or back (2 x the model's gradient bytes
    # a step, 2.6 GB at Flux's 2 + 4 blocks in bf16), and a step graph keeps them at static addresses
    grad_bucket_view: bool = False
    # --weights zero2: each bucket's parameters all-gathered under the backward that reduced it (backward), or under
    # the next step's forward, each unit of the forward waiting for its own buckets' (forward, as FSDP prefetches)
    zero2_gather: Literal["backward", "forward"] = "backward"
    # --zero2-gather forward: the share of the buckets, from the forward's first, gathered under the forward; the rest
    # (the last layers': reduced first in the backward, read last in the forward) under the backward that reduced them
    zero2_forward_share: float = 1.0
    zero2_bucket_mb: float = 25.0  # --weights zero2: its flat buckets' size (DDP's bucket_cap_mb, its default)
    # --weights fsdp as a team tunes it at depth (parallel.mesh.shard_weights); the defaults are FSDP2's own
    fsdp_prefetch: int = 0  # blocks whose all-gathers a block's forward (backward) issues ahead; 0: FSDP2's implicit 1
    fsdp_reshard_last: int = 0  # the last K blocks keep their gathered parameters from forward to backward
    fsdp_reduce_dtype: Literal["param", "fp32"] = "param"  # the gradients' reduce-scatter dtype (param: the run's)
    # each rank's shards of the parameters, their gradients and AdamW's state kept in host memory (FSDP2's
    # CPUOffloadPolicy): the GPU holds a block's gathered weights at a time and the activations; AdamW steps on the
    # CPU. What lets Flux.1's full fine-tune (~89 GiB of weights and state) train on one 80 GB GPU
    fsdp_cpu_offload: bool = False
    # --fp8 tensorwise under FSDP2: the weights cast to float8 on each shard and all-gathered in float8 (half the
    # bytes, no cast of the whole weight per linear), their scales from one all-reduce of amaxes after each optimizer
    # step (torchao's enable_fsdp_float8_all_gather + precompute_float8_dynamic_scale_for_fsdp: torchtitan's float8)
    fsdp_fp8_all_gather: bool = False
    accelerator: Literal["auto", "cpu", "gpu"] = "auto"  # auto: gpu if CUDA is visible
    # how a sample's tokens (or, for tp, the weights) are split over ranks: torch (torch's ring attention),
    # allgather-kv, ulysses (all-to-all over heads), tp (tensor + sequence parallelism), none; auto: none on one
    # rank, torch on GPUs, allgather-kv on CPU
    cp: CP = "auto"
    rotate: Literal["allgather", "alltoall"] = "allgather"  # torch ring: how K/V shards move
    # ulysses: q, k and v sent to their head groups in one all-to-all (fused) or one each (separate)
    ulysses_qkv: Literal["fused", "separate"] = "fused"
    # ulysses: in the single-stream blocks the all-to-alls run under the MLP branch's GEMMs, which never read the
    # attention (issued before them, awaited after them, forward and backward), instead of stalling it
    ulysses_overlap: bool = False
    sdpa_backend: Literal["auto", "cudnn", "flash", "efficient", "math"] = "auto"  # SDPA kernel (auto: torch's pick)
    precision: Literal["bf16-true", "32-true", "64-true"] = "bf16-true"  # weights, activations and batches
    steps: int = 20  # measured steps
    warmup_steps: int = 5  # run first, excluded from the statistics (their loss is kept)
    lr: float = 1e-4  # AdamW learning rate
    # k: each optimizer step's samples of a data-parallel group (--data.batch_size, or --data.global_batch / dp) run as
    # k micro-batches, a forward and backward each, gradients summed and synced once: the step's batch stays the
    # global batch, split k ways (not Lightning's accumulate_grad_batches, which grows the batch k-fold)
    micro_batches: int = 1
    # lightning: the Trainer and this tool's callbacks; bare: the same step (model, strategy, weights, compile,
    # simulated world) in a plain PyTorch loop with one event pair per step, the reference the harness is held to
    harness: Literal["lightning", "bare"] = "lightning"
    # device: each step's synthetic batch made on the training device before the loop (nothing in the step's host
    # path); workers: a DataLoader with worker processes and pinned memory, as a real pipeline (its cost: data_ms)
    loader: Literal["device", "workers"] = "device"
    num_workers: int | None = None  # --loader workers: worker processes; default: 4 on GPU, 0 on CPU
    # Lightning 2.6 broadcasts a SIGTERM flag and reads it back (.item(): a host-device sync) before every step at
    # W > 1; here every N steps (as a pending Lightning change proposes). 1: stock Lightning
    sigterm_every: int = 100
    # > 0 (Lightning harness): a bare twin of the model trains N bare steps after every N measured Lightning steps in
    # this process, so both harnesses' steps see the same host within seconds
    interleave_bare: int = 0
    # an emulated slower host (K >= 1, fractional too): this process pinned to one core beside busy loops weighted to
    # leave it ~1/K of it
    host_slowdown: float = 1.0
    output: str | None = None  # run folder; default: a new runs/<run_name>/<time> (runs/<run_name>/latest points at it)
    overwrite: bool = False  # let --output replace the complete run it holds
    group: str = "adhoc"  # sweep id: one wandb dashboard per group
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"  # wandb run in <output>/wandb; online: synced
    timing: bool = True  # op regions (QKV GEMM, SDPA) inside the step
    # every collective of the instrumented steps recorded (~20-40 us of host per collective, in those steps only);
    # false: none recorded, the report prices the collectives derived from the shapes instead
    ledger: bool = True
    # the instruments (op regions, the ledger) on every Nth measured step (1: all), in both harnesses: the others give
    # step_ms, the instrumented ones step_timed_ms, the ops and the collectives (timing_overhead_pct: their cost); at
    # W >= 2 the instruments' host time would otherwise be step time
    regions_every: int = 4
    idle_probe_every: int = 8  # CUDA: every Nth measured step lets the host run ahead -> device_busy_ms (0: off)
    profile: bool = False  # torch.profiler over profile_steps extra steps after warm-up: traces + kernel breakdown
    profile_steps: int = 3  # --profile: steps traced
    compile: bool = False  # torch.compile each block (compilation happens in warm-up, never in step times)
    # torch.compile's mode (reduce-overhead: CUDA graphs)
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    compile_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"  # torch.compile's backend
    # blocks: each block on its own (torchtitan's way); model: one graph for the whole forward (and one CUDA graph
    # per pass under reduce-overhead), fewer host launches where the per-rank step is short
    compile_scope: Literal["blocks", "model"] = "blocks"
    # CUDA: the whole step (forward, backward, gradient sync, optimizer) captured in one CUDA graph at the last warm-up
    # step and replayed after it: the host issues a step in a few launches
    step_graph: bool = False
    # activation checkpointing: none; full (a block's forward again in its backward);
    # selective (the GEMMs' and attention's outputs kept, the elementwise ops recomputed, torchtitan's op policy)
    checkpointing: Literal["none", "selective", "full"] = "none"
    checkpoint_fraction: float = 1.0  # --checkpointing full|selective: the share of the blocks covered, the first ones
    # FP8 linears (torchao's float8 training, GPU): the blocks' token GEMMs in float8 with tensorwise or rowwise
    # scales (the AdaLN, embedder and output linears stay bf16); under LoRA the frozen base's, cast once (no torchao);
    # MFU stays against the bf16 peak
    fp8: Literal["none", "tensorwise", "rowwise"] = "none"
    # LoRA: adapters of this rank on --lora-targets, the base weights frozen (0: every weight trains)
    lora_rank: int = 0
    lora_alpha: float | None = None  # the adapters' scale is alpha / rank; default: alpha = rank (diffusers' Flux LoRA)
    # presets (attention: q, k, v and output projections of both streams; mlp) and module names, comma-separated
    lora_targets: str = "attention"
    # the AdaLN modulation linears (conditioning vector -> shifts, scales, gates: a cost that does not shrink with
    # the tokens a rank holds) split over the CP group by output features, one all-gather each
    split_conditioning: bool = False
    # W >= 2: this process is rank --simulate-rank of a W-rank job over torch's fake process group
    # (torch's fake backend): the real code with a rank's shapes, collectives moving nothing; --ops-only takes a list
    simulate_world: int | list[int] | str | None = None
    simulate_rank: int = 0  # which rank of the simulated job this process is
    # a simulated rank on a GPU: each collective it issues also puts its traffic on the device (a kernel on a side
    # stream, --contention-ctas CTAs for the collective's priced time, moving its bus bytes), as a real rank's NCCL
    # kernels share SMs and memory with the compute they overlap
    contention: bool = False
    contention_ctas: int = 24  # --contention: CTAs the traffic keeps resident (NCCL on NVLink: ~16-32 channels)
    sync_debug: bool = False  # CUDA: count the loop's synchronizing calls by call site (torch's sync debug mode)
    gc_every: int = 0  # > 0: Python's automatic GC off in training, a young-generation collect every N steps
    dump_grads: bool = False  # save every parameter's gradient after the first step (numerics checks)
    dump_ops: bool = False  # save the compute ops (aten op, shapes) of the first measured step: ops_rank<r>.json
    dump_params: bool = False  # save every parameter after the last step (numerics checks: the whole update)
    timeout_s: float = 900.0  # a stalled step (hung rank/collective) ends the run: process-group timeout + watchdog
    # op-only microbenchmark; lists are given as "4608,16384" or [4608, 16384]
    ops_only: bool = False  # time SDPA fwd/bwd and the QKV GEMM per call instead of training steps
    seq_lens: int | list[int] | str | None = None  # total image+text tokens per sample; default: the config's
    seed_compat: bool = False  # also time the seed script's way: its shapes, one loop between barriers
    graph: bool = False  # also time each op replayed from a CUDA graph, where the strategy allows it
    reps: int | None = None  # most timed calls per op (default 100 on GPU, 5 on CPU)

    @property
    def world_size(self) -> int:
        """Ranks of the job: devices x nodes, or the simulated job's W (this process being one of them)."""
        if isinstance(self.simulate_world, int) and not self.ops_only:
            return self.simulate_world
        return self.devices * self.num_nodes

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many CP groups, each on its own samples."""
        return self.world_size // (self.cp_degree or self.world_size)


@dataclass
class BenchConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    run: RunConfig = field(default_factory=RunConfig)
    config_file: str | None = None  # the model's config: the first --config, or the machine's default
    config_overlays: list[str] = field(default_factory=list)  # recipes (no model: settings) laid over the default

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# What runs ran with before a setting existed, where that is not its default (their summaries lack the setting)
BEFORE_SETTING = {"ulysses_qkv": "separate"}


def run_setting(run: dict, name: str):
    """A run setting from a summary's config.run: an older summary lacks the settings added since, which its run
    had at BEFORE_SETTING's value, else at the default."""
    if name in run:
        return run[name]
    return BEFORE_SETTING.get(name, RunConfig.__dataclass_fields__[name].default)


def config_from_summary(cfg: dict) -> BenchConfig:
    """A summary.json's `config` back as a BenchConfig: keys that are no longer settings dropped, run settings added
    since at the value the run had (BEFORE_SETTING, else the default)."""
    def known(klass, d: dict) -> dict:
        names = {f.name for f in dataclasses.fields(klass)}
        return {k: v for k, v in d.items() if k in names}

    run = known(RunConfig, cfg["run"]) | {k: v for k, v in BEFORE_SETTING.items() if k not in cfg["run"]}
    return BenchConfig(model=ModelConfig(**known(ModelConfig, cfg["model"])),
                       data=DataConfig(**known(DataConfig, cfg["data"])), run=RunConfig(**run))


# --help groups of the run settings (fields not named here: "Run")
RUN_GROUPS = {
    "Parallelism": ("cp", "cp_degree", "weights", "zero_bucket_view", "grad_bucket_view", "zero2_gather",
                    "zero2_forward_share", "zero2_bucket_mb", "fsdp_prefetch", "fsdp_reshard_last", "fsdp_reduce_dtype",
                    "fsdp_cpu_offload", "fsdp_fp8_all_gather", "rotate", "ulysses_qkv", "ulysses_overlap",
                    "sdpa_backend", "split_conditioning", "simulate_world", "simulate_rank"),
    "Harness": ("harness", "loader", "num_workers", "sigterm_every", "interleave_bare"),
    "Memory": ("checkpointing", "checkpoint_fraction"),  # not bookkeeping: recompute is step time
    "Precision": ("fp8",),
    "LoRA": ("lora_rank", "lora_alpha", "lora_targets"),
    "Host": ("host_slowdown",),  # not bookkeeping: it changes the measured step
    "Contention": ("contention", "contention_ctas"),  # not bookkeeping: it changes the measured step
    "Timing and profiling": ("timing", "regions_every", "idle_probe_every", "profile", "profile_steps", "sync_debug",
                             "gc_every"),
    "Ledger": ("ledger",),  # not bookkeeping: it costs its steps host time (and older runs' every step)
    "Compile": ("compile", "compile_mode", "compile_backend", "compile_scope", "step_graph"),
    "Op bench (--ops-only)": ("ops_only", "seq_lens", "seed_compat", "graph", "reps"),
    "Output": ("output", "overwrite", "group", "wandb_mode", "dump_grads", "dump_params", "dump_ops"),
}


@functools.cache
def field_help(cls) -> dict[str, str]:
    """Each field's comment in the source (on its line, else the lines just above it): its --help text."""
    import inspect
    import io
    import tokenize

    out, above, line_field = {}, [], {}
    for tok in tokenize.generate_tokens(io.StringIO(inspect.getsource(cls)).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if tok.start[0] in line_field:
                out[line_field[tok.start[0]]] = text  # the field's own line
            else:
                above.append(text)
        elif tok.type == tokenize.NAME and tok.start[1] == 4 and tok.start[0] not in line_field:
            line_field[tok.start[0]] = tok.string
            if above:
                out.setdefault(tok.string, " ".join(above))
            above = []
    return {f.name: out.get(f.name, "") for f in dataclasses.fields(cls)}


@functools.cache  # a sweep parses every run's settings: build the parser once
def _parser(defaults_from: str | None = None):
    from jsonargparse import ActionConfigFile, ArgumentParser

    desc = "Flux DiT training-step benchmark under context parallelism."
    if defaults_from:
        desc += f" Defaults shown are {_rel(defaults_from)}'s ({_why_default(defaults_from)}), then the built-in ones."
    p = ArgumentParser(
        prog="train_bench.py",
        usage="train_bench.py [--config YAML] [options]",
        description=desc,
        exit_on_error=False,
        default_env=False,
        print_config="--print-config",
    )
    p.add_argument("--config", action=ActionConfigFile, help="YAML of settings (configs/*.yaml); flags override it")
    for key, cls in (("model", ModelConfig), ("data", DataConfig)):
        p.add_class_arguments(cls, key)
        p.groups[key].title = f"{cls.__doc__.strip()}"  # not jsonargparse's <class ...> without docstring_parser
        p._option_string_actions[f"--{key}"].help = f"a YAML holding {key} settings alone"  # not jsonargparse's wording
        helps = field_help(cls)
        for a in p._actions:
            if a.dest.startswith(f"{key}.") and a.dest[len(key) + 1:] in helps:
                a.help = helps[a.dest[len(key) + 1:]]
    # Run settings as top-level dashed flags (the results contract), keyed by field name in YAML, in groups.
    helps = field_help(RunConfig)
    group_of = {name: title for title, names in RUN_GROUPS.items() for name in names}
    groups = {title: p.add_argument_group(title) for title in ("Run", *RUN_GROUPS)}
    for f in dataclasses.fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        flag_kw = {"nargs": "?", "const": True} if f.type is bool else {}  # a bare `--graph` means true
        groups[group_of.get(f.name, "Run")].add_argument(flag, dest=f.name, type=f.type, default=f.default,
                                                        help=helps[f.name], **flag_kw)
    if defaults_from:
        import yaml

        given = yaml.safe_load(Path(defaults_from).read_text()) or {}
        flat = {f"{k}.{kk}": vv for k, v in given.items() if isinstance(v, dict) for kk, vv in v.items()}
        p.set_defaults({**{k: v for k, v in given.items() if not isinstance(v, dict)}, **flat})
    return p


def _rel(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(CONFIG_DIR.parent)) if p.is_relative_to(CONFIG_DIR.parent) else path


def _why_default(config_file: str) -> str:
    if Path(config_file).resolve() == CPU_DEFAULT:
        return f"no GPU on this machine; with one: {GPU_DEFAULT.relative_to(CONFIG_DIR.parent)}"
    if Path(config_file).resolve() == GPU_DEFAULT:
        return "a GPU is visible"
    return "--config"


def parse_config(argv: list[str] | None = None, *, cuda_available: bool | None = None) -> BenchConfig:
    """Parse argv into a BenchConfig. Without --config: the Flux config on a GPU machine, else tiny. A --config that
    names no model (a recipe: settings only) is laid over that machine default, so it runs where it is given."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    default = str(GPU_DEFAULT if cuda_available else CPU_DEFAULT)
    files = _find_configs(argv)
    if "-h" in argv or "--help" in argv:  # prints help with the defaults that apply here, exits 0
        shown = files[0] if files and Path(files[0]).is_file() else None
        _parser(shown or default).parse_args(["--help"])
    texts = {f: _read_config(f) for f in files}
    overlays = []
    if not any(_names_model(t) for t in texts.values()):  # none (or only recipes): the machine's default model first
        overlays = files
        files = [default, *files]
        argv = ["--config", default, *argv]
    config_file = files[0]
    parser = _parser()
    try:
        ns = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        if isinstance(e, SystemExit) and not e.code:  # --print-config printed, as asked
            raise
        msg = _one_line(str(e))
        if "accept" in msg or "parsing config" in msg:  # the YAML file, not a flag, is at fault
            msg = f"--config {' --config '.join(overlays or files)}: {msg}"
        raise ConfigError(msg) from None
    d = ns.as_dict()
    d.pop("config", None)
    model = ModelConfig(**d.pop("model"))
    data = DataConfig(**d.pop("data"))
    run = RunConfig(**{f.name: d[f.name] for f in dataclasses.fields(RunConfig)})
    return BenchConfig(model=model, data=data, run=run, config_file=config_file, config_overlays=overlays)


def _read_config(config_file: str) -> str:
    path = Path(config_file)
    if path.is_dir():
        raise ConfigError(f"--config {config_file}: a folder, not a YAML file (choose one of {CONFIG_DIR}/*.yaml)")
    if not path.is_file():
        raise ConfigError(f"--config {config_file}: file not found (choose one of {CONFIG_DIR}/*.yaml)")
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"--config {config_file}: unreadable ({e.strerror})") from None
    if not text.strip():
        raise ConfigError(f"--config {config_file}: empty (a YAML of settings, e.g. configs/tiny.yaml)")
    if _is_sweep(text):
        raise ConfigError(f"--config {config_file}: a sweep file (a grid of runs), not a run's settings: run "
                          f"python scripts/sweep.py {config_file}")
    return text


def _names_model(text: str) -> bool:
    """The YAML sets model dimensions (a model config), not run settings alone (a recipe)."""
    import yaml

    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError:
        return True  # the parser names the fault, with this file first
    return isinstance(d, dict) and isinstance(d.get("model"), dict)


def _is_sweep(text: str) -> bool:
    """A sweep YAML (flux_cp/runs/sweep_config.py: axes, base, include) rather than a run's settings."""
    import yaml

    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError:
        return False  # the parser names the fault
    return isinstance(d, dict) and ("axes" in d or "include" in d) and not {"model", "data"} & set(d)


def _find_configs(argv: list[str]) -> list[str]:
    """Every --config given, in order ("" for one without its value)."""
    found = []
    for i, a in enumerate(argv):
        if a == "--config":
            found.append(argv[i + 1] if i + 1 < len(argv) else "")
        elif a.startswith("--config="):
            found.append(a.split("=", 1)[1])
    return found


_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false"}


def _one_line(msg: str) -> str:
    """jsonargparse errors span lines; keep what names the setting and the problem."""
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    text = " ".join(lines)
    for prefix in ("Parser key ", "Problem with given value "):
        text = text.replace(prefix, "")
    run_keys = {f.name for f in dataclasses.fields(RunConfig)}
    text = re.sub(
        r'^"([\w.]+)":',
        lambda m: "--" + (m[1].replace("_", "-") if m[1] in run_keys else m[1]) + ":",
        text,
    )
    text = re.sub(r"^(--[\w.-]+): Expected a typing\.Literal\[(.*)\]\. Got value: (.*)$",
                  lambda m: f"{m[1]} {m[3]}: choose one of {m[2].replace(chr(39), '')}", text)
    text = re.sub(r"^(--[\w.-]+): Expected a <class '(\w+)'>\. Got value: (.*)$",
                  lambda m: f"{m[1]} {m[3]}: expected {_TYPE_WORDS.get(m[2], m[2])}", text)
    if "does not accept option" in text or "Unrecognized arguments" in text:
        text += " (see --help, or configs/flux_4608.yaml for every key)"
    return text


def run_name(cfg: BenchConfig, mode: str = "train") -> str:
    run = cfg.run
    if mode == "ops":
        w = f"sim{'-'.join(map(str, run.simulate_world))}" if run.simulate_world else f"W{run.world_size}"
        return f"ops-{w}-{run.cp}-s{run.seq_lens[0]}"
    w = f"W{run.world_size}"
    if run.simulate_world:
        w += f"sim{f'r{run.simulate_rank}' if run.simulate_rank else ''}"
    dp = f"-dp{run.dp}" if run.dp > 1 else ""
    fsdp = ("" if run.weights == "ddp" else f"-{run.weights}") + ("-splitcond" if run.split_conditioning else "")
    compiled = ""
    if run.compile:
        compiled = "-compiled" + ("" if run.compile_mode == "default" else f"-{run.compile_mode}")
        compiled += "-model" if run.compile_scope == "model" else ""
    bare = "-bare" if run.harness == "bare" else ""
    if run.checkpointing != "none":
        compiled += f"-ac{run.checkpointing}" + ("" if run.checkpoint_fraction == 1 else f"{run.checkpoint_fraction:g}")
    if run.fp8 != "none":
        compiled += f"-fp8{run.fp8}"
    if run.lora_rank:
        targets = "" if run.lora_targets == "attention" else "-" + run.lora_targets.replace(",", "+")
        compiled += f"-lora{run.lora_rank}{targets}"
    if run.weights == "fsdp":  # its tuning, where set
        fsdp += "".join(f"-{k}{v}" for k, v in (("pf", run.fsdp_prefetch), ("rl", run.fsdp_reshard_last)) if v)
        fsdp += "-rs32" if run.fsdp_reduce_dtype == "fp32" else ""
        fsdp += "-ag8" if run.fsdp_fp8_all_gather else ""
        fsdp += "-offload" if run.fsdp_cpu_offload else ""
    return f"{mode}-{w}{dp}-{run.cp}{fsdp}-s{cfg.data.seq_len}{compiled}{bare}"
