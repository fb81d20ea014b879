"""FP8 linears (--fp8 tensorwise|rowwise), applied to a built model from outside it, before any sharding (FSDP2 and
DDP then see torchao's Float8Linear as they saw nn.Linear: same parameters, same names).

torchao's float8 training casts a linear's input, weight and output gradient to float8 (e4m3) with one scale per
tensor (tensorwise) or per row (rowwise: finer, a little slower) and runs its three GEMMs on the FP8 tensor cores; the
weights, their gradients and AdamW's state stay in the run's bf16. Only the GEMMs where it pays are converted:

    converted   every block linear over the token stream (attention's q/k/v and output projections, both streams;
                the MLPs): M = tokens, K and N >= 1024
    kept bf16   the AdaLN modulation linears (M = B: a handful of rows, the cast costs more than the GEMM saves),
                the embedders and the output projection (K or N = 64), and any linear with K or N < 1024 or not a
                multiple of 16 (FP8 GEMMs need 16-aligned dims; torchtitan's filter skips small ones likewise)

Under LoRA (--lora-rank) the same linears are frozen, so torchao's Float8Linear would waste a third of their FLOPs
(it computes the weight's gradient whether or not it is wanted) and recast the unchanging weight every step. There
they become FrozenFloat8Linear: the weight cast to float8 once, when the step is built in the run's precision
(cache_frozen_fp8), the forward and the input's gradient on the FP8 tensor cores, no weight gradient, no input kept
for the backward. Its scaling follows torchao's recipe of the same name (tensorwise: e4m3 inputs and weights, e5m2
gradients, one scale a tensor; rowwise: e4m3, a scale a row, rounded down to a power of 2).

MFU stays in model FLOPs against the device's bf16 dense peak (summary.json `fp8` says so): FP8 shows in tokens/s.
"""

import dataclasses

import torch
from torch import nn

from flux_cp.config import ModelConfig
from flux_cp.linears import BlockLinear, block_linears

MIN_DIM = 1024  # K and N below this: the float8 casts cost more than the faster GEMM saves
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
EPS = 1e-12  # torchao's floor on amax: an all-zero tensor casts to zeros, not NaN


def fp8_linears(m: ModelConfig) -> list[BlockLinear]:
    """The linears --fp8 converts in a model of config m: the blocks' token GEMMs (flux_cp/linears.py) whose K and N
    are >= MIN_DIM and 16-aligned (the planner counts their weights' float8 copies under LoRA)."""
    return [lin for lin in block_linears(m)
            if min(lin.fan_in, lin.fan_out) >= MIN_DIM and lin.fan_in % 16 == 0 and lin.fan_out % 16 == 0]


def fp8_targets(model) -> list[str]:
    """Qualified names of fp8_linears(model.cfg)."""
    return [lin.name for lin in fp8_linears(model.cfg)]


def fp8_weights(m: ModelConfig) -> int:
    """The converted linears' weights (elements): what a float8 copy of them holds, a byte each."""
    return sum(lin.fan_in * lin.fan_out for lin in fp8_linears(m))


def apply_fp8(model, recipe: str, fsdp_all_gather: bool = False) -> None:
    """Convert fp8_targets(model) to float8 with `recipe`'s scaling: torchao's Float8Linear where the weight trains,
    FrozenFloat8Linear where it is frozen (a LoRA base, wrapped by flux_cp/train/lora.py: apply_lora runs first).
    fsdp_all_gather (--fsdp-fp8-all-gather, tensorwise): FSDP2 then gathers the weights in float8 (torchao casts each
    shard before the all-gather); precompute_fp8_scales sets their scales after each optimizer step."""
    if recipe == "none":
        return
    trained = set()
    for name in fp8_targets(model):
        module = model.get_submodule(name)
        if module.weight.requires_grad:
            trained.add(name)
            continue
        if hasattr(module, "base_layer"):  # an adapted linear: its frozen base is what converts
            module, name = module.base_layer, name + ".base_layer"
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, FrozenFloat8Linear.from_linear(module, recipe))
    if trained:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(recipe)
        if fsdp_all_gather:
            config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
        convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn in trained)


def precompute_fp8_scales(model) -> None:
    """--fsdp-fp8-all-gather: every float8 weight's scale from its amax over all shards, in one all-reduce (else each
    weight's cast would all-reduce its own amax before its gather); after each optimizer step, as torchtitan does."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def cache_frozen_fp8(model) -> int:
    """Cast every FrozenFloat8Linear's weight to float8 as it is now (the run's precision, on its device); returns how
    many. FluxStep calls it once the harness has cast and placed the model."""
    frozen = [m for m in model.modules() if isinstance(m, FrozenFloat8Linear)]
    for m in frozen:
        m.cache()
    return len(frozen)


def to_float8(x: torch.Tensor, dtype: torch.dtype, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) cast to float8 with one scale (tensorwise) or one a row (rowwise, a power of 2, as torchao's rowwise
    recipe); returns (x8, inverse scale: (1,) or (M, 1), fp32), so that x ~= x8 * inverse."""
    amax = (x.abs().amax(dim=-1, keepdim=True) if rowwise else x.abs().amax()).float().clamp(min=EPS)
    scale = torch.finfo(dtype).max / amax
    if rowwise:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    x8 = (x.float() * scale).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype)
    return x8, scale.reciprocal().reshape(-1, 1) if rowwise else scale.reciprocal()


def cpu_scales(a8, b8, a_inv, b_inv) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales torch._scaled_mm(a8 (M, K), b8 (K, N)) is given. On a CPU a tensor-wise pair goes in broadcast to
    rows (M, 1) and columns (1, N), the same product: oneDNN runs a single-scale float8 matmul on its reference kernel
    on some CPUs (a Xeon with AMX: 2.5 s for a 144 x 256 x 768 GEMM, ~1000x its row-wise path)."""
    if a8.device.type == "cpu" and a_inv.numel() == 1 and b_inv.numel() == 1:
        a_inv = a_inv.reshape(1, 1).expand(a8.shape[0], 1).contiguous()
        b_inv = b_inv.reshape(1, 1).expand(1, b8.shape[1]).contiguous()
    return a_inv, b_inv


def scaled_mm(a8, b8, a_inv, b_inv, out_dtype, use_fast_accum=False) -> torch.Tensor:
    """torch._scaled_mm: a8 @ b8 scaled by a_inv and b_inv (cpu_scales: why they may be broadcast)."""
    a_inv, b_inv = cpu_scales(a8, b8, a_inv, b_inv)
    return torch._scaled_mm(a8, b8, scale_a=a_inv, scale_b=b_inv, out_dtype=out_dtype, use_fast_accum=use_fast_accum)


class _FrozenFloat8Matmul(torch.autograd.Function):
    """y = x W^T on float8 tensor cores, W frozen and cast already: the backward gives x's gradient alone."""

    @staticmethod
    def forward(ctx, x, w8, w_inv, w8t, wt_inv, rowwise):
        ctx.save_for_backward(w8t, wt_inv)  # the cached weight only: no activation kept
        ctx.rowwise = rowwise
        x2 = x.reshape(-1, x.shape[-1])  # (M, K)
        x8, x_inv = to_float8(x2, E4M3, rowwise)
        # fast accumulation in the forward's GEMM alone, as torchao's default config (its gradients' GEMMs: exact)
        y = scaled_mm(x8, w8.t(), x_inv, w_inv, x.dtype, use_fast_accum=True)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        w8t, wt_inv = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])  # (M, N)
        g8, g_inv = to_float8(g2, E4M3 if ctx.rowwise else E5M2, ctx.rowwise)
        dx = scaled_mm(g8, w8t.t(), g_inv, wt_inv, grad.dtype)  # (M, K)
        return dx.reshape(*grad.shape[:-1], dx.shape[-1]), None, None, None, None, None


class FrozenFloat8Linear(nn.Linear):
    """A frozen nn.Linear (same parameters, same names) whose GEMMs run in float8 on a weight cast once (cache())."""

    @classmethod
    def from_linear(cls, base: nn.Linear, recipe: str) -> "FrozenFloat8Linear":
        with torch.device("meta"):
            new = cls(base.in_features, base.out_features, bias=base.bias is not None)
        new.weight, new.bias, new.recipe = base.weight, base.bias, recipe
        new.w8 = new.w_inv = new.w8t = new.wt_inv = None
        return new

    def cache(self) -> None:
        """The weight as float8, twice: W (N, K) with a scale per output row (rowwise) for the forward, and W^T (K, N)
        with a scale per input column for the input's gradient (the GEMM scales mat2 by column); tensorwise: one scale.
        Plain attributes, not buffers: no .to(dtype) recasts them, no DDP broadcasts them."""
        if self.weight.requires_grad:
            raise RuntimeError(f"FrozenFloat8Linear caches its weight once: it must be frozen ({self.extra_repr()})")
        rowwise = self.recipe == "rowwise"
        w = self.weight.detach()
        self.w8, w_inv = to_float8(w, E4M3, rowwise)  # (N, K), inverse (N, 1) or (1,)
        self.w_inv = w_inv.reshape(1, -1) if rowwise else w_inv  # (1, N): the scale of mat2 = W^T's columns
        self.w8t, wt_inv = to_float8(w.t().contiguous(), E4M3, rowwise)  # (K, N), inverse (K, 1) or (1,)
        self.wt_inv = wt_inv.reshape(1, -1) if rowwise else wt_inv  # (1, K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w8 is None:
            raise RuntimeError("FrozenFloat8Linear: its float8 weight is not cached (train.fp8.cache_frozen_fp8)")
        y = _FrozenFloat8Matmul.apply(x, self.w8, self.w_inv, self.w8t, self.wt_inv, self.recipe == "rowwise")
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return super().extra_repr() + f", fp8={self.recipe}, frozen"
