"""Benchmark settings: dataclasses, loaded from configs/*.yaml and overridden on the command line.

Precedence: dataclass defaults (Flux.1 dims) < --config YAML < command-line flags.
Model and data settings are nested (`--model.num_heads 4`); run settings are top-level flags
(`--devices 2`, `--warmup-steps 3`), with the same names as keys in the YAML file.
"""

import argparse
import dataclasses
import functools
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GPU_DEFAULT = CONFIG_DIR / "flux_4608.yaml"
CPU_DEFAULT = CONFIG_DIR / "tiny.yaml"

CP = Literal["auto", "torch", "allgather-kv", "ulysses", "none"]
STRATEGIES = ("torch", "allgather-kv", "ulysses", "none")
HEAD_SHARDING = ("ulysses",)  # strategies that split heads across the CP group


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
    seed: int = 0  # weights' init and batches: the same at every world size and strategy

    @property
    def image_tokens(self) -> int:
        return self.image_height * self.image_width

    @property
    def seq_len(self) -> int:
        return self.image_tokens + self.text_tokens


@dataclass
class RunConfig:
    devices: int = 1  # per node
    num_nodes: int = 1  # Lightning's cluster environments (torchrun, SLURM, NODE_RANK + MASTER_ADDR) join them
    cp_degree: int | None = None  # ranks per CP group; default: all of them (pure CP). dp = ranks / cp_degree
    # replicated + all-reduce; the same with AdamW state sharded (ZeRO-1); or FSDP2 sharded, over all dp x cp ranks
    weights: Literal["ddp", "zero", "fsdp"] = "ddp"
    accelerator: Literal["auto", "cpu", "gpu"] = "auto"  # auto: gpu if CUDA is visible
    cp: CP = "auto"  # CP strategy; auto: none on one rank, torch on GPUs, allgather-kv on CPU
    rotate: Literal["allgather", "alltoall"] = "allgather"  # torch ring: how K/V shards move
    sdpa_backend: Literal["auto", "cudnn", "flash", "efficient", "math"] = "auto"  # SDPA kernel (auto: torch's pick)
    precision: Literal["bf16-true", "32-true", "64-true"] = "bf16-true"  # weights, activations and batches
    steps: int = 20  # measured steps
    warmup_steps: int = 5  # run first, excluded from the statistics (their loss is kept)
    lr: float = 1e-4  # AdamW learning rate
    # lightning: the Trainer and this tool's callbacks; bare: the same step (model, strategy, weights, compile,
    # simulated world) in a plain PyTorch loop with one event pair per step, the reference the harness is held to
    harness: Literal["lightning", "bare"] = "lightning"
    # device: each step's synthetic batch made on the training device before the loop (nothing in the step's host
    # path); workers: a DataLoader with worker processes and pinned memory, as a real pipeline (its cost: data_ms)
    loader: Literal["device", "workers"] = "device"
    num_workers: int | None = None  # --loader workers: worker processes; default: 4 on GPU, 0 on CPU
    # Lightning 2.6 broadcasts a SIGTERM flag and reads it back (.item(): a host-device sync) before every step at
    # W > 1 (its PR 20825); here every N steps, as its PR 21640 proposes. 1: stock Lightning
    sigterm_every: int = 100
    output: str | None = None  # run folder; default: a new runs/<run_name>/<time> (runs/<run_name>/latest points at it)
    overwrite: bool = False  # let --output replace the complete run it holds
    group: str = "adhoc"  # sweep id: one wandb dashboard per group
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"  # wandb run in <output>/wandb; online: synced
    timing: bool = True  # op regions (QKV GEMM, SDPA) inside the step
    timing_ab: bool = False  # overhead check: regions on and off in alternate steps (step_untimed_ms)
    idle_probe_every: int = 4  # CUDA: every Nth measured step lets the host run ahead -> device_busy_ms (0: off)
    profile: bool = False  # torch.profiler over profile_steps extra steps after warm-up: traces + kernel breakdown
    profile_steps: int = 3  # --profile: steps traced
    compile: bool = False  # torch.compile each block (compilation happens in warm-up, never in step times)
    # torch.compile's mode (reduce-overhead: CUDA graphs)
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    compile_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"  # torch.compile's backend
    # blocks: each block on its own (torchtitan's way); model: one graph for the whole forward (and one CUDA graph
    # per pass under reduce-overhead), fewer host launches where the per-rank step is short
    compile_scope: Literal["blocks", "model"] = "blocks"
    # the AdaLN modulation linears (conditioning vector -> shifts, scales, gates: a cost that does not shrink with
    # the tokens a rank holds) split over the CP group by output features, one all-gather each (flux_cp.parallel)
    split_conditioning: bool = False
    # W >= 2: this process is rank --simulate-rank of a W-rank job over torch's fake process group
    # (flux_cp/simulate.py): the real code with a rank's shapes, collectives moving nothing; --ops-only takes a list
    simulate_world: int | list[int] | str | None = None
    simulate_rank: int = 0  # which rank of the simulated job this process is
    sync_debug: bool = False  # CUDA: count the loop's synchronizing calls by call site (torch's sync debug mode)
    gc_every: int = 0  # > 0: Python's automatic GC off in training, a young-generation collect every N steps
    dump_grads: bool = False  # save every parameter's gradient after the first step (numerics checks)
    dump_ops: bool = False  # save the compute ops (aten op, shapes) of the first measured step: ops_rank<r>.json
    dump_params: bool = False  # save every parameter after the last step (numerics checks: the whole update)
    timeout_s: float = 900.0  # a stalled step (hung rank/collective) ends the run: process-group timeout + watchdog
    # op-only microbenchmark (flux_cp/opbench.py); lists are given as "4608,16384" or [4608, 16384]
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
    config_file: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --help groups of the run settings (fields not named here: "Run")
RUN_GROUPS = {
    "Parallelism": ("cp", "cp_degree", "weights", "rotate", "sdpa_backend", "split_conditioning", "simulate_world",
                    "simulate_rank"),
    "Harness": ("harness", "loader", "num_workers", "sigterm_every"),
    "Timing and profiling": ("timing", "timing_ab", "idle_probe_every", "profile", "profile_steps", "sync_debug",
                             "gc_every"),
    "Compile": ("compile", "compile_mode", "compile_backend", "compile_scope"),
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
    """Parse argv into a BenchConfig. Without --config: the Flux config on a GPU machine, else tiny."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    config_file = _find_config(argv)
    if "-h" in argv or "--help" in argv:  # prints help with the defaults that apply here, exits 0
        shown = config_file if config_file and Path(config_file).is_file() else None
        _parser(shown or str(GPU_DEFAULT if cuda_available else CPU_DEFAULT)).parse_args(["--help"])
    if config_file is None:
        config_file = str(GPU_DEFAULT if cuda_available else CPU_DEFAULT)
        argv = ["--config", config_file, *argv]
    path = Path(config_file)
    if not path.is_file():
        raise ConfigError(f"--config {config_file}: file not found (choose one of {CONFIG_DIR}/*.yaml)")
    try:
        path.read_text()
    except OSError as e:
        raise ConfigError(f"--config {config_file}: unreadable ({e.strerror})") from None
    parser = _parser()
    try:
        ns = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        if isinstance(e, SystemExit) and not e.code:  # --print-config printed, as asked
            raise
        msg = _one_line(str(e))
        if "accept" in msg or "parsing config" in msg:  # the YAML file, not a flag, is at fault
            msg = f"--config {config_file}: {msg}"
        raise ConfigError(msg) from None
    d = ns.as_dict()
    d.pop("config", None)
    model = ModelConfig(**d.pop("model"))
    data = DataConfig(**d.pop("data"))
    run = RunConfig(**{f.name: d[f.name] for f in dataclasses.fields(RunConfig)})
    return BenchConfig(model=model, data=data, run=run, config_file=str(path))


def _find_config(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--config":
            return argv[i + 1] if i + 1 < len(argv) else ""
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    return None


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
    if run.steps < 1 or run.warmup_steps < 0:
        raise ConfigError(f"--steps {run.steps} --warmup-steps {run.warmup_steps}: need steps >= 1, warmup >= 0")
    if run.timeout_s <= 0:
        raise ConfigError(f"--timeout-s {run.timeout_s}: must be > 0 seconds")
    if run.compile and run.warmup_steps < 2:
        raise ConfigError(
            f"--warmup-steps {run.warmup_steps}: --compile compiles (and may recompile) in warm-up; use >= 2"
        )
    if run.profile and run.profile_steps < 1:
        raise ConfigError(f"--profile-steps {run.profile_steps}: must be >= 1 (extra steps after warm-up)")
    if run.num_workers is None:
        run.num_workers = 4 if run.accelerator == "gpu" and run.loader == "workers" else 0
    if run.num_workers < 0:
        raise ConfigError(f"--num-workers {run.num_workers}: must be >= 0 (0: batches made in the main process)")
    if run.num_workers and run.loader != "workers":
        raise ConfigError(f"--num-workers {run.num_workers}: worker processes make batches with --loader workers only "
                          "(add it, or drop --num-workers)")
    if run.sigterm_every < 1:
        raise ConfigError(f"--sigterm-every {run.sigterm_every}: a number of steps >= 1 (1: Lightning's every step)")
    if run.harness == "bare":
        _check_bare(run)
    if run.sync_debug and run.accelerator != "gpu":
        raise ConfigError("--sync-debug: torch's sync debug mode watches CUDA calls (drop it, or run on a GPU)")
    if run.gc_every < 0:
        raise ConfigError(f"--gc-every {run.gc_every}: 0 (Python's automatic collection) or a number of steps >= 1")
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
    if run.split_conditioning and (2 * model.hidden) % w + (3 * model.hidden) % w:
        raise ConfigError(
            f"--split-conditioning: the modulation linears' widths (2, 3 and 6 x hidden {model.hidden}) must divide "
            f"by the CP degree {w} (pick a CP degree dividing {2 * model.hidden} and {3 * model.hidden}, or drop it)"
        )
    return cfg


# Settings of the Lightning harness that the bare loop (one event pair per step, nothing else) has no use for
LIGHTNING_ONLY = {"timing_ab": False, "profile": False, "sync_debug": False, "gc_every": 0, "dump_ops": False,
                  "loader": "device"}


def _check_bare(run: RunConfig) -> None:
    for key, default in LIGHTNING_ONLY.items():
        if getattr(run, key) != default:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(run, key)}: a setting of the Lightning harness; --harness bare times "
                              f"whole steps only (drop {flag}, or use --harness lightning)")


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


def _check_heads(model: ModelConfig, cp: str, w: int, what: str, fix: str) -> None:
    """Head-sharding strategies need heads divisible by the split."""
    if cp in HEAD_SHARDING and model.num_heads % w:
        raise ConfigError(
            f"--model.num_heads {model.num_heads} is not divisible by {what}, which --cp {cp} needs "
            f"(it shards heads: {fix} dividing {model.num_heads}, or --cp allgather-kv)"
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
    if run.graph and run.accelerator != "gpu":
        raise ConfigError("--graph: CUDA graphs need a GPU (drop --graph, or use --accelerator gpu)")
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
    return cfg


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
    return f"{mode}-{w}{dp}-{run.cp}{fsdp}-s{cfg.data.seq_len}{compiled}{bare}"
