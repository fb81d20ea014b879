"""Model FLOPs from the shapes, and throughput and MFU from a step time: the units plans are compared in.

    f = model_flops(cfg.model, cfg.data)            # one sample's forward: {"gemm", "attention", "total"}
    t = throughput(step_ms=50.9, world=1, samples=1, seq_len=4608, fwd_flops=f["total"], peak=peak_flops("H200"))

Counted per sample, forward (multiply-adds x 2), d = hidden, S = image + text tokens, r = single blocks' MLP ratio:
    double block   every token: q,k,v (3 d^2), out (d^2), MLP 4d (8 d^2)       = (4 + 2 x 4) d^2 MACs (diffusers'
                   FluxTransformerBlock has a fixed 4x MLP); its two AdaLN modulations 2 x 6 d^2 once per sample
    single block   every token: q,k,v (3 d^2), MLP in (r d^2), out ((1 + r) d^2) = (4 + 2 r) d^2 MACs; 3 d^2 a sample
    attention      Q K^T and P V over all heads: 2 S^2 d MACs a block (non-causal: the whole square)
    embedders      image (C d) and text (Dt d) tokens in, C d out; the timestep and pooled-text MLPs, the output norm
Training = 3 x forward (backward: a gradient for the input and one for the weight of every GEMM), the convention of
MFU (PaLM, torchtitan). Elementwise work (norms, RoPE, softmax, GELU) is not counted: it is memory-bound, and MFU
asks how much of the tensor cores' peak the model's necessary matrix work uses.
"""

from flux_cp.config import DataConfig, ModelConfig

# Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, by the name CUDA gives the device. Not Lightning's
# get_available_flops: its H200 entry (2.0e15) is the datasheet's with-sparsity figure, twice the dense one.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0,
                    "B200": 2250.0, "L40S": 362.0, "A10G": 70.0}
TIMESTEP_CHANNELS = 256  # diffusers' Timesteps(num_channels=256) in CombinedTimestepTextProjEmbeddings


def model_flops(model: ModelConfig, data: DataConfig, seq_len: int | None = None) -> dict:
    """One sample's forward FLOPs by part ({"gemm", "attention", "total"}); seq_len: another length, the image
    tokens taking the difference (the text stays data.text_tokens)."""
    d, r = model.hidden, model.mlp_ratio
    S = seq_len or data.seq_len
    St = data.text_tokens
    Si = S - St
    per_sample = (TIMESTEP_CHANNELS * d + d * d) + (model.pooled_dim * d + d * d)  # timestep and pooled MLPs
    per_sample += model.double_blocks * 2 * 6 * d * d + model.single_blocks * 3 * d * d + 2 * d * d  # modulations
    per_token = model.double_blocks * (4 + 2 * 4) * d * d + model.single_blocks * (4 + 2 * r) * d * d
    embed = Si * model.in_channels * d + St * model.text_dim * d + Si * d * model.in_channels
    gemm = 2 * (per_sample + S * per_token + embed)
    attention = 2 * (model.double_blocks + model.single_blocks) * 2 * S * S * d
    return {"gemm": float(gemm), "attention": float(attention), "total": float(gemm + attention)}


_LORA_FLOPS: dict[str, dict] = {}  # lora_train_flops by its arguments: summary.json's flushes between steps ask again


def lora_train_flops(model: ModelConfig, data: DataConfig, targets: str, rank: int,
                     seq_len: int | None = None) -> dict:
    """One sample's training FLOPs under LoRA (--lora-rank): the base is frozen, so its GEMMs skip the weight
    gradient (2 x forward), and autograd skips the input gradient wherever nothing upstream trains: the embedders and
    AdaLN modulations (1 x), the first adapted block's input projections and everything before them (1 x); the
    adapters cost 3 x forward (their A 2 x where its input needs no gradient); attention 3 x after the first adapter.
    Returns {"gemm", "attention", "adapters", "total"} (training FLOPs) and "fwd" (the forward's, adapters included)."""
    key = repr((model, data, targets, rank, seq_len))  # the configs' dataclass reprs: every field
    if key not in _LORA_FLOPS:
        _LORA_FLOPS[key] = _lora_train_flops(model, data, targets, rank, seq_len)
    return dict(_LORA_FLOPS[key])


def _lora_train_flops(model: ModelConfig, data: DataConfig, targets: str, rank: int, seq_len: int | None) -> dict:
    from flux_cp.linears import block_linears
    from flux_cp.lora import lora_modules

    S = seq_len or data.seq_len
    St = data.text_tokens
    tokens = {"image": S - St, "text": St, "all": S}
    adapted = lora_modules(model, targets)
    first = min(lin.order for lin in adapted)
    f = model_flops(model, data, seq_len)
    lin_fwd = {lin.name: 2.0 * tokens[lin.stream] * lin.fan_in * lin.fan_out for lin in block_linears(model)}
    blocks_fwd = sum(lin_fwd.values())
    head = 2.0 * (S - St) * model.hidden * model.in_channels  # proj_out: reads the blocks' output (trains upstream)
    rest = f["gemm"] - blocks_fwd - head  # embedders and modulations: no gradient flows into them
    gemm = rest + 2 * head
    for lin in block_linears(model):
        gemm += lin_fwd[lin.name] * (1 if lin.order <= first else 2)
    blocks = model.double_blocks + model.single_blocks
    per_block_attn = f["attention"] / blocks
    attention = sum(per_block_attn * (3 if (b, 1) > first else 1) for b in range(blocks))
    adapters = fwd_adapters = 0.0
    for lin in adapted:
        a, b = 2.0 * tokens[lin.stream] * lin.fan_in * rank, 2.0 * tokens[lin.stream] * rank * lin.fan_out
        fwd_adapters += a + b
        adapters += a * (2 if lin.order <= first else 3) + 3 * b
    return {"gemm": gemm, "attention": attention, "adapters": adapters, "total": gemm + attention + adapters,
            "fwd": f["total"] + fwd_adapters}


def peak_flops(device_name: str | None, precision: str = "bf16-true") -> tuple[float | None, str]:
    """(dense peak FLOP/s, where it comes from) for this device and precision; None where not known."""
    if precision != "bf16-true":
        return None, f"no peak for {precision}: MFU is against the dense bf16 tensor-core peak"
    name = (device_name or "").upper()
    for key, tflops in PEAK_BF16_TFLOPS.items():  # longest names first in the table where they share a prefix
        if key.upper() in name:
            return tflops * 1e12, f"{key} dense bf16 peak, {tflops:g} TFLOP/s"
    return None, f"unknown device {device_name!r}: no dense bf16 peak on record (MFU not computed)"


def throughput(step_ms: float | None, world: int, samples: int, seq_len: int, fwd_flops: float,
               peak: float | None, train_flops: float | None = None) -> dict:
    """Work per second at one optimizer step of `samples` samples (the global batch) over `world` GPUs.
    Named as Lightning's ThroughputMonitor names them (throughput/... and throughput/device/...). train_flops: one
    sample's training FLOPs where they are not 3 x forward (LoRA: lora_train_flops)."""
    flops = (train_flops if train_flops is not None else 3.0 * fwd_flops) * samples
    out = {"samples_per_step": samples, "tokens_per_step": samples * seq_len, "model_flops_per_step": flops}
    if not step_ms:
        return out
    s = step_ms / 1e3
    out |= {
        "throughput/samples_per_sec": samples / s,
        "throughput/items_per_sec": samples * seq_len / s,  # tokens
        "throughput/flops_per_sec": flops / s,
        "throughput/device/samples_per_sec": samples / s / world,
        "throughput/device/items_per_sec": samples * seq_len / s / world,
        "throughput/device/flops_per_sec": flops / s / world,
    }
    if peak:
        out["throughput/device/mfu"] = flops / s / world / peak
    return out


CPU_STEP_WARN_S = 60.0  # a CPU run whose step is estimated past this says so before it starts


def cpu_rate(dtype, n: int = 384, reps: int = 3) -> float:
    """This host's matmul rate (FLOP/s, all of torch's threads) in dtype: the best of a few n^3 products (~10 ms)."""
    import time

    import torch

    a = torch.randn(n, n, dtype=dtype)
    best = float("inf")
    for _ in range(reps + 1):  # the first warms the kernels
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def cpu_step_estimate_s(cfg, samples: int, rate: float) -> float:
    """Seconds a training step of `samples` samples takes on this CPU at `rate` FLOP/s: model FLOPs alone (the
    elementwise work and the overheads add to it), so an estimate from below."""
    return 3.0 * model_flops(cfg.model, cfg.data)["total"] * samples / rate


def covered(n_blocks: int, mode: str, fraction: float = 1.0) -> int:
    """How many of n blocks checkpointing covers: the first round(fraction x n) in forward order (their activations
    live longest: the backward reaches them last), at least one."""
    return 0 if mode == "none" else max(1, round(fraction * n_blocks))


def hardware_flops_factor(checkpointing: str, fraction: float = 1.0) -> float:
    """Hardware FLOPs / model FLOPs of a training step under activation checkpointing: full recompute runs the
    covered blocks' forward again (4 forwards' work where the model's is 3); selective keeps the GEMMs' and attention's
    outputs, so it recomputes no counted FLOPs (its elementwise recompute is memory-bound, not in either count). MFU
    stays in model FLOPs; summary.json's throughput carries the hardware figure beside it."""
    from flux_cp.config import ConfigError

    if checkpointing == "full":
        return 1 + fraction / 3
    if checkpointing in ("none", "selective"):
        return 1.0
    raise ConfigError(f"--checkpointing {checkpointing}: choose one of none, selective, full")
