"""--cp tp: Megatron-LM's tensor parallelism with sequence parallelism over the CP group, the comparator past CP.

At batch 1 Flux's weights outweigh its activations (2.6 GB of bf16 gradients for 2 + 4 blocks against 28 MB a
joint-sequence activation): every CP strategy keeps the weights whole on each rank and syncs the whole model's
gradients each step. TP + SP shards the weights instead. Each rank holds 1/W of every block's heads (its rows of
q, k, v, its columns of the attention's output projection) and of its MLP (rows of the first linear, columns of the
second); between blocks the tokens stay sharded as under CP (norms, AdaLN modulation and residuals on 1/W of them):

    x_local (B, S/W, D) --all-gather--> x (B, S, D) --local heads, local MLP columns--> partial (B, S, D)
                        <-reduce-scatter--  (the sum over ranks' partials, each rank's own tokens)

A single-stream block gathers once (attention and MLP read one normed input) and reduce-scatters once (proj_out
sums both); a double-stream block gathers and reduce-scatters around its attention and around its FF, each stream
on its own. Backward: the adjoints (reduce-scatter, all-gather). The AdaLN modulation linears (26% of the weights,
reading one (B, D) vector) are sharded by output features, their outputs gathered: kilobytes. No all-to-all; no
gradient sync for the sharded weights; the replicated ones (embedders, norms, the row-parallel layers' biases: 4%
of Flux's 2 + 4 blocks) are all-reduced by DDP as under CP.

Gradients: each rank backpropagates its local loss (the mean over its tokens), as under CP. A sharded weight sees
every rank's tokens (through the all-gather) with every rank's loss (through the reduce-scatter's adjoint): its
gradient is that of the sum of the W local losses, so it is divided by W (a hook) to be the mean loss's; a
replicated weight's gradient is its rank's share of that sum, which DDP's average turns into the mean's. With dp
data-parallel groups (--cp-degree below the world), each group's sum is divided by all dp x W ranks and the ranks
holding the same shard in the dp groups all-reduce it (a second hook, after the gradient is accumulated, skipped
inside `dp_sync_off()`: with --micro-batches k the sum of the k micro-batches' gradients is all-reduced once, in the
last backward): the global mean loss's gradient.

Token order: a double block gathers its image and its text stream separately (each in order: [text, image] is then
Flux's order, the full RoPE table); a single block gathers its joint [text_r, image_r] shards in rank order (one
collective), so its attention runs over that order with the RoPE table permuted alike (non-causal, unmasked
attention is indifferent to the order of its tokens, given each token's own angles).

    shard_model(model, rank, world)          # before DDP and the optimizer: parameters replaced by their shards
    apply_tp(model, strategy, timer, rope)    # the forwards (after apply_cp); rope: (full, rank-order) tables
"""

import contextlib
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from flux_cp.parallel.cp import CPAttnProcessor, CPStrategy, _all_gather_single, _reduce_scatter_single


class TensorParallel(CPStrategy):
    """Attention over this rank's heads and the whole sequence (the block forwards below gather it)."""

    name = "tp"

    def sdpa_shapes(self, b, h, s_local, d):
        full = (b, h // self.world, s_local * self.world, d)
        return full, full


# ---------------------------------------------------------------- the sequence gathered and scattered


class _Gather(torch.autograd.Function):
    """(B, S_l, D) -> (B, W * S_l, D), ranks in order; backward: reduce-scatter (the sum of every rank's gradient
    of its tokens)."""

    @staticmethod
    def forward(ctx, x, group, world):
        ctx.group, ctx.world = group, world
        xs = x.transpose(0, 1).contiguous()  # (S_l, B, D): collectives concatenate along dim 0
        out = xs.new_empty((world * xs.shape[0], *xs.shape[1:]))
        _all_gather_single(out, xs, group=group)
        # one contiguous copy (free at B = 1): else each linear reading it copies it again and keeps its own for the
        # backward (a single block's qkv and MLP: two (B, S, D) a block, measured at B = 8 on an H100)
        return out.transpose(0, 1).contiguous()

    @staticmethod
    def backward(ctx, g):
        gs = g.transpose(0, 1).contiguous()
        out = gs.new_empty((gs.shape[0] // ctx.world, *gs.shape[1:]))
        _reduce_scatter_single(out, gs, group=ctx.group)
        return out.transpose(0, 1), None, None


class _Scatter(torch.autograd.Function):
    """(B, W * S_l, D) partial sums -> (B, S_l, D), this rank's tokens summed over ranks; backward: all-gather."""

    @staticmethod
    def forward(ctx, y, group, world):
        ctx.group, ctx.world = group, world
        ys = y.transpose(0, 1).contiguous()
        out = ys.new_empty((ys.shape[0] // world, *ys.shape[1:]))
        _reduce_scatter_single(out, ys, group=group)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, g):
        gs = g.transpose(0, 1).contiguous()
        out = gs.new_empty((ctx.world * gs.shape[0], *gs.shape[1:]))
        _all_gather_single(out, gs, group=ctx.group)
        return out.transpose(0, 1), None, None


class _GatherFeatures(torch.autograd.Function):
    """(B, F/W) -> (B, F), ranks' features in order; backward: reduce-scatter (the sum of the ranks' gradients of
    this rank's features: each rank's local loss reads all of them)."""

    @staticmethod
    def forward(ctx, y, group, world):
        ctx.group, ctx.world = group, world
        out = y.new_empty((world * y.shape[1], y.shape[0]))
        _all_gather_single(out, y.t().contiguous(), group=group)
        return out.t()

    @staticmethod
    def backward(ctx, g):
        gs = g.t().contiguous()
        out = gs.new_empty((gs.shape[0] // ctx.world, gs.shape[1]))
        _reduce_scatter_single(out, gs, group=ctx.group)
        return out.t(), None, None


class _MeanOfSum(torch.autograd.Function):
    """Identity forward; backward: the ranks' gradients summed and divided by W. The conditioning vector feeds only
    sharded modulation linears, so each rank's gradient of it is its features' share of the W local losses' sum:
    all-reduced it is that sum's, / W the mean loss's, the same on every rank (DDP's average of the replicated
    embedders' gradients then leaves it so)."""

    @staticmethod
    def forward(ctx, x, group, world):
        ctx.group, ctx.world = group, world
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g / ctx.world, None, None


def _modulation(lin: nn.Linear, s: TensorParallel, x):
    """An AdaLN modulation linear (B, D) -> (B, F) over its sharded output features, gathered (kilobytes)."""
    return _GatherFeatures.apply(F.linear(_MeanOfSum.apply(x, s.group, s.world), lin.weight, lin.bias), s.group,
                                 s.world)


def _row_parallel(lin: nn.Linear, x, s: TensorParallel):
    """A linear whose input features are this rank's: its partial product reduce-scattered, then the bias."""
    y = _Scatter.apply(F.linear(x, lin.weight), s.group, s.world)
    return y + lin.bias if lin.bias is not None else y


# ---------------------------------------------------------------- the weights sharded


def _shard(lin: nn.Linear, dim: int, index: list[torch.Tensor], rank: int, world: int, group) -> None:
    """lin's weight reduced to this rank's rows (dim 0: output features, with the bias) or columns (dim 1: input
    features; the bias, added after the reduce-scatter, stays whole and replicated). index[r]: rank r's features."""
    w = lin.weight
    lin.weight = nn.Parameter(w.detach().index_select(dim, index[rank].to(w.device)).clone())
    # what a dump needs to put the whole weight together again (flux_cp.parallel.mesh.full_grads / full_params)
    lin.weight._tp = {"dim": dim, "index": index, "shape": tuple(w.shape), "group": group, "world": world}
    if dim == 0 and lin.bias is not None:
        b = lin.bias
        lin.bias = nn.Parameter(b.detach().index_select(0, index[rank].to(b.device)).clone())
        lin.bias._tp = {"dim": 0, "index": index, "shape": tuple(b.shape), "group": group, "world": world}


def _blocks(n: int, world: int, offsets=(0,)) -> list[torch.Tensor]:
    """Each rank's features: its 1/W of n at each offset (fused q, k, v: 0, n, 2n)."""
    k = n // world
    return [torch.cat([torch.arange(o + r * k, o + (r + 1) * k) for o in offsets]) for r in range(world)]


def shard_model(model, rank: int, world: int, group, dp_group=None, dp: int = 1) -> list[str]:
    """Every block's heads and MLP features split over the group, from outside the model (diffusers' modules kept,
    their weights replaced by this rank's shards); returns the sharded parameters' names (DDP ignores them).
    dp > 1: dp TP groups train their own samples; the ranks holding the same shard (dp_group) sum its gradients."""
    if world == 1:
        return []
    d = model.cfg.hidden
    heads = _blocks(d, world)  # a rank's heads: contiguous head_dim blocks
    qkv = _blocks(d, world, (0, d, 2 * d))  # the fused projection: [q; k; v] rows
    for blk in model.double_blocks:
        attn = blk.attn
        for lin, idx in ((getattr(attn, "to_qkv", None), qkv), (getattr(attn, "to_added_qkv", None), qkv),
                         *((getattr(attn, n, None), heads) for n in ("to_q", "to_k", "to_v", "add_q_proj",
                                                                     "add_k_proj", "add_v_proj"))):
            if lin is not None:
                _shard(lin, 0, idx, rank, world, group)
        _shard(attn.to_out[0], 1, heads, rank, world, group)
        _shard(attn.to_add_out, 1, heads, rank, world, group)
        for ff in (blk.ff, blk.ff_context):
            first, last = ff.net[0].proj, ff.net[-1]
            if not isinstance(last, nn.Linear):  # diffusers' FeedForward with final_dropout: not Flux's
                raise ValueError(f"--cp tp: a FeedForward ending in {type(last).__name__}, not its output linear")
            mlp = _blocks(first.out_features, world)
            _shard(first, 0, mlp, rank, world, group)
            _shard(last, 1, mlp, rank, world, group)
    for blk in model.single_blocks:
        attn = blk.attn
        for lin, idx in ((getattr(attn, "to_qkv", None), qkv),
                         *((getattr(attn, n, None), heads) for n in ("to_q", "to_k", "to_v"))):
            if lin is not None:
                _shard(lin, 0, idx, rank, world, group)
        mlp = _blocks(blk.mlp_hidden_dim, world)
        _shard(blk.proj_mlp, 0, mlp, rank, world, group)
        # proj_out reads [attention (D), MLP (4D)]: this rank's heads' columns, then its MLP columns
        _shard(blk.proj_out, 1, [torch.cat([h, d + m]) for h, m in zip(heads, mlp)], rank, world, group)
    for lin in model.conditioning_linears():  # AdaLN: 26% of Flux's weights; their outputs are kilobytes
        _shard(lin, 0, _blocks(lin.out_features, world), rank, world, group)
    sharded = [(n, p) for n, p in model.named_parameters() if hasattr(p, "_tp")]
    for _, p in sharded:  # the gradient of the W local losses' sum -> of their mean (module docstring)
        p.register_hook(functools.partial(torch.div, other=world * dp))
        if dp > 1:  # each TP group's share of the global mean loss's gradient, summed over the groups
            p.register_post_accumulate_grad_hook(functools.partial(_sum_over, group=dp_group))
    return [n for n, _ in sharded]


_dp_sync = True  # off inside dp_sync_off(): the earlier micro-batches' backwards


@contextlib.contextmanager
def dp_sync_off():
    """A backward whose sharded gradients stay on the rank (DDP's no_sync for the TP-sharded weights): they are
    summed into .grad, and the last micro-batch's backward all-reduces the sum once, not k times."""
    global _dp_sync
    _dp_sync = False
    try:
        yield
    finally:
        _dp_sync = True


def _sum_over(p: torch.Tensor, group) -> None:
    # After accumulation (a post-accumulate hook): p.grad holds every micro-batch's gradient so far
    if _dp_sync:
        dist.all_reduce(p.grad, group=group)  # blocking, in backward order: every rank issues the same sequence


def full_tensor(t: torch.Tensor, meta: dict) -> torch.Tensor:
    """The whole tensor of a sharded weight (or its gradient) from every rank's shard: collective over its group."""
    parts = [torch.empty_like(t) for _ in range(meta["world"])]
    dist.all_gather(parts, t.contiguous(), group=meta["group"])
    full = t.new_zeros(meta["shape"])
    for part, idx in zip(parts, meta["index"]):
        full.index_copy_(meta["dim"], idx.to(t.device), part)
    return full


# ---------------------------------------------------------------- the forwards


class TPAttnProcessor(CPAttnProcessor):
    """A double-stream block's attention: both streams gathered, this rank's heads over the whole sequence, each
    stream's output projection row-parallel. (The single-stream blocks' forward is replaced whole: `_single`.)"""

    def __init__(self, strategy: TensorParallel, timer, rope):
        super().__init__(strategy, timer)
        self.rope = rope  # {"full": (cos, sin) of [text, image] in order, "ranks": of the rank-order joint shards}

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        s = self.strategy
        img = _Gather.apply(hidden_states, s.group, s.world)  # (B, Si, D)
        txt = _Gather.apply(encoder_hidden_states, s.group, s.world)  # (B, St, D)
        q, k, v = self.project(attn, img, txt, self.rope["full"])  # (B, H/W, S, Dh)
        out = self._attention(q, k, v)  # (B, S, D/W)
        t = txt.shape[1]
        img = attn.to_out[1](_row_parallel(attn.to_out[0], out[:, t:], s))  # (B, Si_l, D)
        return img, _row_parallel(attn.to_add_out, out[:, :t], s)

    def _attention(self, q, k, v):
        call = self.timer.open("sdpa")
        q, k, v = call.enter(q, k, v)
        (out,) = call.exit(self.strategy.attention(q, k, v))
        return out.transpose(1, 2).flatten(2, 3).to(q.dtype)


def _ff(ff, s: TensorParallel, hidden_states):
    """diffusers' FeedForward (GELU projection, dropout, linear), column- then row-parallel."""
    x = _Gather.apply(hidden_states, s.group, s.world)
    for m in ff.net[:-1]:
        x = m(x)
    return _row_parallel(ff.net[-1], x, s)


def _single(blk, proc: TPAttnProcessor, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
            joint_attention_kwargs=None):
    """diffusers' FluxSingleTransformerBlock.forward (0.42) under TP + SP: one gather, one reduce-scatter."""
    s = proc.strategy
    text_len = encoder_hidden_states.shape[1]
    x = torch.cat([encoder_hidden_states, hidden_states], dim=1)  # (B, S_l, D): [text_r, image_r]
    nx, gate = blk.norm(x, emb=temb)
    full = _Gather.apply(nx, s.group, s.world)  # (B, S, D): every rank's [text_r, image_r], in rank order
    attn = blk.attn
    q, k, v = proc.project(attn, full, None, proc.rope["ranks"])  # (B, H/W, S, Dh)
    mlp = blk.act_mlp(blk.proj_mlp(full))  # (B, S, 4D/W)
    y = _row_parallel(blk.proj_out, torch.cat([proc._attention(q, k, v), mlp], dim=2), s)  # (B, S_l, D)
    x = x + gate.unsqueeze(1) * y
    if x.dtype == torch.float16:
        x = x.clip(-65504, 65504)
    return x[:, :text_len], x[:, text_len:]


def rope_tables(model, txt_ids: torch.Tensor, img_ids: torch.Tensor, world: int, dtype) -> dict:
    """The RoPE tables TP's attention reads: of every token in Flux's [text, image] order (double blocks), and of
    every rank's [text_r, image_r] shard in rank order (single blocks' gathered joint sequence)."""
    from flux_cp.parallel.cp import shard

    ranks = [model.rope(shard(txt_ids, 0, r, world), shard(img_ids, 0, r, world), dtype) for r in range(world)]
    return {"full": model.rope(txt_ids, img_ids, dtype),
            "ranks": tuple(torch.cat([t[i] for t in ranks]) for i in range(2))}


def ignore_in_ddp(module: nn.Module, names: list[str], prefix: str = "") -> None:
    """DDP leaves the sharded weights alone (each rank's are its own; their gradients need no sync)."""
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, [prefix + n for n in names])


def apply_tp(model, strategy: TensorParallel, timer, rope: dict) -> None:
    """The blocks' forwards for a model sharded by shard_model (after apply_cp, before compile)."""
    if strategy.world == 1:
        return
    proc = TPAttnProcessor(strategy, timer, rope)
    for lin in model.conditioning_linears():
        lin.forward = functools.partial(_modulation, lin, strategy)
    for blk in model.double_blocks:
        blk.attn.set_processor(proc)
        for ff in (blk.ff, blk.ff_context):
            ff.forward = functools.partial(_ff, ff, strategy)
    for blk in model.single_blocks:
        blk.forward = functools.partial(_single, blk, proc)
