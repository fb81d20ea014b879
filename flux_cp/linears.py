"""The blocks' token linears of a Flux model, read from its config alone (names, shapes, the tokens each sees, its
place in the forward): the table that LoRA's targets and FLOPs (flux_cp/lora.py) and FP8's conversion
(flux_cp/train/fp8.py) read, checked against a built model by tests/test_lora.py.

Every linear of a block that works on the token stream, with the tokens it sees and where it sits in the block:

    double block   image stream: to_q, to_k, to_v (fused: to_qkv), to_out.0, ff.net.0.proj, ff.net.2   (Si tokens)
                   text stream:  add_q_proj, add_k_proj, add_v_proj (fused: to_added_qkv), to_add_out,
                                 ff_context.net.0.proj, ff_context.net.2                                 (St tokens)
    single block   to_q, to_k, to_v (fused: to_qkv), proj_mlp, proj_out                                 (S tokens)

Stages in a block, in forward order: 0 the projections that read the block's normed input (q, k, v; a single
block's proj_mlp), 1 attention, 2 the output projections (to_out.0, to_add_out; a single block's proj_out), 3 and 4
the double block's MLPs (in, out). The AdaLN modulation linears (one row a sample) and the embedders are not in it.
"""

from dataclasses import dataclass

from flux_cp.config import ModelConfig


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
