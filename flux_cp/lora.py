"""LoRA's shape: which of the model's block linears (flux_cp/linears.py) take adapters (--lora-targets), read from
the model config alone, so that settings checks, FLOP counts and the planner's memory agree with what
flux_cp/train/lora.py builds. The AdaLN modulation linears and the embedders are never adapted.

A model with fused projections (model.fuse_qkv, Flux.1's config here) has one adapter on to_qkv where diffusers'
unfused model has three (q, k, v): rank r shared by the three, 2/3 of their adapter FLOPs and parameters; set
model.fuse_qkv false to mirror diffusers' LoRA exactly.

Presets: `attention` (diffusers' train_dreambooth_lora_flux.py: q, k, v and the output projections of both streams),
`mlp` (the MLPs and the single blocks' proj_mlp, proj_out); a list mixes presets and module names (suffixes of the
qualified names: `to_qkv`, `ff.net.2`, `single_blocks.3.proj_mlp`).
"""

from flux_cp.config import ConfigError, ModelConfig
from flux_cp.linears import BlockLinear, block_linears

PRESETS = {
    "attention": ("to_q", "to_k", "to_v", "to_qkv", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                  "to_added_qkv", "to_add_out"),
    "mlp": ("ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "proj_mlp", "proj_out"),
}


def lora_modules(m: ModelConfig, targets: str) -> list[BlockLinear]:
    """The linears --lora-targets names (presets and module-name suffixes, comma-separated), in forward order; a name
    that matches none of the model's block linears is refused in one line."""
    linears = block_linears(m)
    chosen = set()
    for item in (t.strip() for t in targets.split(",")):
        names = PRESETS.get(item, (item,))
        hit = {lin.name for lin in linears if any(lin.name == n or lin.name.endswith("." + n) for n in names)}
        if not hit:
            known = sorted({lin.name.split(".", 2)[2] for lin in linears})
            raise ConfigError(f"--lora-targets {targets}: {item or '(empty)'} names none of this model's block linears "
                              f"(presets: {', '.join(PRESETS)}; modules: {', '.join(known)})")
        chosen |= hit
    return [lin for lin in linears if lin.name in chosen]


def adapter_params(m: ModelConfig, targets: str, rank: int) -> int:
    """The adapters' parameters (LoRA's A: fan_in x r, B: r x fan_out, no bias): what trains."""
    return sum(rank * (lin.fan_in + lin.fan_out) for lin in lora_modules(m, targets))
