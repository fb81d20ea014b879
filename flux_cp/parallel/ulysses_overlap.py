"""--ulysses-overlap: Ulysses' all-to-alls under the MLP branch of Flux's single-stream blocks.

A single block computes attention and an MLP side by side from one normed input and joins them in proj_out:

    y = x + gate * proj_out([attention(nx), gelu(proj_mlp(nx))])

The MLP branch never reads the attention, so Ulysses' all-to-alls, which otherwise stall the step (the attention
waits for q, k, v; proj_out for the output), can run while it computes, in both directions:

    forward    q, k, v -> head groups   under proj_mlp + GELU
               output  -> token shards  under proj_out's MLP columns
    backward   d output -> head groups  under the MLP columns' backward
               dq, dk, dv -> token shards  under GELU's and proj_mlp's backward

Each all-to-all is two autograd nodes, `_Issue` (forward: issue; backward: wait) and `_Await` (forward: wait;
backward: issue the reverse), created before and after the MLP work. The autograd engine runs the ready node created
last first, so a backward issues at `_Await`, runs the MLP's backward (created between them), and waits at `_Issue`.
proj_out is split by its input columns into two GEMMs (the same sum, its MLP part first). Functional collectives
(`_c10d_functional`): dynamo traces them and the ledger stamps where each is awaited. The double-stream blocks keep
the blocking all-to-alls: nothing of theirs is independent of the attention but the short text stream.

    overlap_single_blocks(model, strategy)   # after apply_cp, before compile
"""

import functools

import torch
import torch.nn.functional as F

from flux_cp.parallel.cp import Ulysses, by_head_group, by_seq_chunk, join_heads, join_seq, sdpa

_C = torch.ops._c10d_functional


def _all_to_all(x, group_name: str, world: int):  # x (W, ...): chunk j to rank j; not awaited
    splits = [x.shape[0] // world] * world
    return _C.all_to_all_single(x.contiguous(), splits, splits, group_name)


class _Issue(torch.autograd.Function):
    """Issues the all-to-all of a send buffer (W, ...) and returns its result in flight; backward awaits the
    gradient's all-to-all that `_Await` issued (an equal-split all-to-all is its own adjoint)."""

    @staticmethod
    def forward(ctx, send, group_name, world):
        return _all_to_all(send, group_name, world)

    @staticmethod
    def backward(ctx, g):
        return _C.wait_tensor(g), None, None


class _Await(torch.autograd.Function):
    @staticmethod
    def forward(ctx, recv, group_name, world):
        ctx.group_name, ctx.world = group_name, world
        return _C.wait_tensor(recv)

    @staticmethod
    def backward(ctx, g):
        return _all_to_all(g, ctx.group_name, ctx.world), None, None


def _single_block_forward(blk, strategy: Ulysses, timer, hidden_states, encoder_hidden_states, temb,
                          image_rotary_emb=None, joint_attention_kwargs=None):
    """diffusers' FluxSingleTransformerBlock.forward (0.42), its attention's all-to-alls around the MLP branch."""
    name, world = strategy.group.group_name, strategy.world
    text_len = encoder_hidden_states.shape[1]
    x = torch.cat([encoder_hidden_states, hidden_states], dim=1)  # (B, S_l, D): [text, image]
    nx, gate = blk.norm(x, emb=temb)
    attn = blk.attn
    q, k, v = attn.processor.project(attn, nx, None, image_rotary_emb)  # (B, H, S_l, Dh)
    heads = _Issue.apply(by_head_group(torch.stack([q, k, v]), world), name, world)  # (W, 3, B, H/W, S_l, Dh)
    mlp = blk.act_mlp(blk.proj_mlp(nx))  # (B, S_l, 4D), under the all-to-all

    call = timer.open("sdpa")  # the region: the all-to-all's wait, the SDPA, the output's issue
    (heads,) = call.enter(heads)
    q, k, v = join_seq(_Await.apply(heads, name, world)).unbind(0)  # (B, H/W, S, Dh)
    out = sdpa(q, k, v, strategy.cudnn_possible)
    (back,) = call.exit(_Issue.apply(by_seq_chunk(out[None], world), name, world))  # (W, 1, B, H/W, S_l, Dh)

    w_attn, w_mlp = blk.proj_out.weight.split([attn.inner_dim, blk.mlp_hidden_dim], dim=1)
    y = F.linear(mlp, w_mlp, blk.proj_out.bias)  # (B, S_l, D), under the output's all-to-all
    out = join_heads(_Await.apply(back, name, world))[0]  # (B, H, S_l, Dh)
    y = y + F.linear(out.transpose(1, 2).flatten(2, 3).to(nx.dtype), w_attn)
    x = x + gate.unsqueeze(1) * y
    if x.dtype == torch.float16:
        x = x.clip(-65504, 65504)
    return x[:, :text_len], x[:, text_len:]


def overlap_single_blocks(model, strategy) -> None:
    """Each single-stream block's forward replaced by `_single_block_forward` (parameters and processor kept)."""
    if not isinstance(strategy, Ulysses) or strategy.qkv != "fused":
        raise ValueError(f"overlap_single_blocks: Ulysses with fused q/k/v, not {strategy.name}")
    if strategy.world == 1:  # no all-to-alls to overlap
        return
    for blk in model.single_blocks:
        blk.forward = functools.partial(_single_block_forward, blk, strategy, blk.attn.processor.timer)
