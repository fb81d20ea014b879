"""LoRA's shape: which of the model's linears take adapters (--lora-targets), read from the model config alone, so
that settings checks, FLOP counts and the planner's memory agree with what flux_cp/train/lora.py builds.

Every linear of a block that works on the token stream, with the tokens it sees and where it sits in the block:

    double block   image stream: to_q, to_k, to_v (fused: to_qkv), to_out.0, ff.net.0.proj, ff.net.2   (Si tokens)
                   text stream:  add_q_proj, add_k_proj, add_v_proj (fused: to_added_qkv), to_add_out,
                                 ff_context.net.0.proj, ff_context.net.2                                 (St tokens)
    single block   to_q, to_k, to_v (fused: to_qkv), proj_mlp, proj_out                                 (S tokens)

Stages in a block, in forward order: 0 the projections that read the block's normed input (q, k, v; a single
block's proj_mlp), 1 attention, 2 the output projections (to_out.0, to_add_out; a single block's proj_out), 3 and 4
the double block's MLPs (in, out). The AdaLN modulation linears (one row a sample) and the embedders are never adapted.

A model with fused projections (model.fuse_qkv, Flux.1's config here) has one adapter on to_qkv where diffusers'
unfused model has three (q, k, v): rank r shared by the three, 2/3 of their adapter FLOPs and parameters; set
model.fuse_qkv false to mirror diffusers' LoRA exactly.

Presets: `attention` (diffusers' train_dreambooth_lora_flux.py: q, k, v and the output projections of both streams),
`mlp` (the MLPs and the single blocks' proj_mlp, proj_out); a list mixes presets and module names (suffixes of the
qualified names: `to_qkv`, `ff.net.2`, `single_blocks.3.proj_mlp`).
"""

from dataclasses import dataclass

from flux_cp.config import ConfigError, ModelConfig

PRESETS = {
    "attention": ("to_q", "to_k", "to_v", "to_qkv", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                  "to_added_qkv", "to_add_out"),
    "mlp": ("ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "proj_mlp", "proj_out"),
}


@dataclass(frozen=True)
class BlockLinear:
    name: str  # qualified, as in model.named_modules()
    fan_in: int
    fan_out: int
    stream: str  # "image", "text" or "all": the tokens it multiplies
    block: int  # forward order over all blocks (double first)
    stage: int  # 0 input projections, 1 attention, 2 output projections, 3 MLPs' first linear, 4 their second

    @property
    def order(self) -> tuple[int, int]:
        return self.block, self.stage


def block_linears(m: ModelConfig) -> list[BlockLinear]:
    """The blocks' token linears of a model of config m (tests/test_lora.py checks them against a built model)."""
    d, r = m.hidden, m.mlp_ratio
    mlp = int(d * r)
    qkv = [("to_qkv", d, 3 * d)] if m.fuse_qkv else [(n, d, d) for n in ("to_q", "to_k", "to_v")]
    added = [("to_added_qkv", d, 3 * d)] if m.fuse_qkv else [(n, d, d) for n in ("add_q_proj", "add_k_proj",
                                                                                   "add_v_proj")]
    out = []
    for b in range(m.double_blocks):
        p = f"double_blocks.{b}."
        out += [BlockLinear(p + "attn." + n, i, o, "image", b, 0) for n, i, o in qkv]
        out += [BlockLinear(p + "attn." + n, i, o, "text", b, 0) for n, i, o in added]
        out += [BlockLinear(p + "attn.to_out.0", d, d, "image", b, 2),
                BlockLinear(p + "attn.to_add_out", d, d, "text", b, 2)]
        for ff, stream in (("ff", "image"), ("ff_context", "text")):  # diffusers' FeedForward: a fixed 4x MLP
            out += [BlockLinear(f"{p}{ff}.net.0.proj", d, 4 * d, stream, b, 3),
                    BlockLinear(f"{p}{ff}.net.2", 4 * d, d, stream, b, 4)]
    for s in range(m.single_blocks):
        b, p = m.double_blocks + s, f"single_blocks.{s}."
        out += [BlockLinear(p + "attn." + n, i, o, "all", b, 0) for n, i, o in qkv]
        out += [BlockLinear(p + "proj_mlp", d, mlp, "all", b, 0), BlockLinear(p + "proj_out", d + mlp, d, "all", b, 2)]
    return out


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
