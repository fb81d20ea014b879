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

MFU stays in model FLOPs against the device's bf16 dense peak (summary.json `fp8` says so): FP8 shows in tokens/s.
"""

from flux_cp.linears import block_linears

MIN_DIM = 1024  # K and N below this: the float8 casts cost more than the faster GEMM saves


def fp8_targets(model) -> list[str]:
    """Qualified names of the linears --fp8 converts: the blocks' token GEMMs (flux_cp/linears.py) whose K and N are
    >= MIN_DIM and 16-aligned."""
    return [lin.name for lin in block_linears(model.cfg)
            if min(lin.fan_in, lin.fan_out) >= MIN_DIM and lin.fan_in % 16 == 0 and lin.fan_out % 16 == 0]


def apply_fp8(model, recipe: str) -> None:
    """Convert fp8_targets(model) to torchao's Float8Linear with `recipe`'s scaling."""
    if recipe == "none":
        return
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    targets = set(fp8_targets(model))
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda m, fqn: fqn in targets)
