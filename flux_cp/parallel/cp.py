"""Context-parallel strategies behind one interface, applied to the model from outside.

Every strategy sees a rank's local tokens: its contiguous 1/W of the image tokens and 1/W of the
text tokens, concatenated locally as [text_r, image_r], each token keeping its own RoPE angle.
That is exact for Flux: attention is non-causal, so a query's output is a sum over keys that
does not depend on the order the keys arrive in; only each token's own angle matters.

    strategy = make_strategy("allgather-kv", cp_rank, cp, device, mesh=mesh["cp"])   # registry.py
    apply_cp(model, strategy, timer)       # installs CPAttnProcessor on every FluxAttention
    with strategy.step_context():          # forward AND backward of the step
        ...

`attention(q, k, v)` takes and returns local (B, H, S_local, D) tensors:
- none:          plain SDPA (world size 1).
- allgather-kv:  all-gather K and V (one collective), SDPA of local queries against all keys;
                 backward reduce-scatters dK, dV. Works on gloo (CPU) and NCCL.
- ulysses:       all-to-all from sequence- to head-sharding, full-sequence SDPA on H/W heads,
                 all-to-all back (DeepSpeed-Ulysses). Heads must divide by W.
- torch:         torch's context_parallel (ring attention). Its context patches
                 F.scaled_dot_product_attention, so attention() calls it through the module attribute.
"""

import contextlib
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flux_cp.measure.timing import StepTimer
from flux_cp.model import apply_rope

# torch 2.13 renamed these collectives (the old names warn); 2.11 has only the old ones.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

SDPA_BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


# ---------------------------------------------------------------- sharding


def shard(x: torch.Tensor, dim: int, rank: int, world: int, what: str = "rows") -> torch.Tensor:
    """Rank's contiguous 1/world slice along dim. Uneven sizes raise ValueError: every rank must hold as many
    tokens (the collectives exchange equal chunks, and the mean of local losses is the global mean only then)."""
    if not 0 <= rank < world:
        raise ValueError(f"shard: rank {rank} is not in 0..{world - 1} (world {world})")
    if x.shape[dim] % world:
        n, shape = x.shape[dim], tuple(x.shape)
        raise ValueError(f"shard: {n} {what} (dim {dim} of {shape}) do not split evenly over {world} ranks")
    return x.chunk(world, dim=dim)[rank]


def shard_joint(text, image, dim: int, rank: int, world: int) -> torch.Tensor:
    """[text_r, image_r]: a rank's local joint sequence, in Flux's text-first order (text and image tokens each
    divisible by world: they are sharded separately)."""
    return torch.cat([shard(text, dim, rank, world, "text tokens"), shard(image, dim, rank, world, "image tokens")],
                     dim=dim)


def unshard_joint(local: list[torch.Tensor], text_len: int, dim: int) -> torch.Tensor:
    """Inverse of shard_joint over all ranks' local sequences: the full [text, image] sequence."""
    world = len(local)
    t = text_len // world
    texts = [x.narrow(dim, 0, t) for x in local]
    images = [x.narrow(dim, t, x.shape[dim] - t) for x in local]
    return torch.cat(texts + images, dim=dim)


# ---------------------------------------------------------------- collectives with autograd


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence dim of (..., S_local, D) stacks; backward reduce-scatters."""

    @staticmethod
    def forward(ctx, x, group, world):  # x (2, B, H, S_l, D): K and V in one buffer, one collective
        ctx.group, ctx.world = group, world
        xs = x.movedim(3, 0).contiguous()  # (S_l, 2, B, H, D): collectives concatenate along dim 0
        out = xs.new_empty((world * xs.shape[0], *xs.shape[1:]))
        _all_gather_single(out, xs, group=group)
        return out.movedim(0, 3)  # (2, B, H, S, D), ranks in order

    @staticmethod
    def backward(ctx, g):
        gs = g.movedim(3, 0).contiguous()
        out = gs.new_empty((gs.shape[0] // ctx.world, *gs.shape[1:]))
        _reduce_scatter_single(out, gs, group=ctx.group)  # sum of every rank's queries' dK, dV
        return out.movedim(0, 3), None, None


class _SeqToHeads(torch.autograd.Function):
    """(N, B, H, S_l, D) sequence-sharded -> (N, B, H/W, S, D) head-sharded, by one all-to-all (N: tensors sent
    together, e.g. q, k and v)."""

    @staticmethod
    def forward(ctx, x, group, world):
        ctx.group, ctx.world = group, world
        return _seq_to_heads(x, group, world)

    @staticmethod
    def backward(ctx, g):
        return _heads_to_seq(g, ctx.group, ctx.world), None, None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, world):
        ctx.group, ctx.world = group, world
        return _heads_to_seq(x, group, world)

    @staticmethod
    def backward(ctx, g):
        return _seq_to_heads(g, ctx.group, ctx.world), None, None


def _seq_to_heads(x, group, world):
    send = by_head_group(x, world)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # chunk r: rank r's tokens, my heads
    return join_seq(recv)


def _heads_to_seq(y, group, world):
    send = by_seq_chunk(y, world)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # chunk r: my tokens, rank r's heads
    return join_heads(recv)


# The layouts around the two all-to-alls: chunk j of a send buffer goes to rank j.
def by_head_group(x, world):  # (N, B, H, S_l, D) -> (W, N, B, H/W, S_l, D), chunk j: head group j
    n, b, h, s, d = x.shape
    return x.reshape(n, b, world, h // world, s, d).permute(2, 0, 1, 3, 4, 5).contiguous()


def join_seq(x):  # (W, N, B, H/W, S_l, D), chunk r: tokens of rank r -> (N, B, H/W, W * S_l, D)
    w, n, b, h, s, d = x.shape
    return x.permute(1, 2, 3, 0, 4, 5).reshape(n, b, h, w * s, d)


def by_seq_chunk(y, world):  # (N, B, H/W, S, D) -> (W, N, B, H/W, S/W, D), chunk j: rank j's tokens
    n, b, h, s, d = y.shape
    return y.reshape(n, b, h, world, s // world, d).permute(3, 0, 1, 2, 4, 5).contiguous()


def join_heads(x):  # (W, N, B, H/W, S_l, D), chunk r: head group r -> (N, B, H, S_l, D)
    w, n, b, h, s, d = x.shape
    return x.permute(1, 2, 0, 3, 4, 5).reshape(n, b, w * h, s, d)


# ---------------------------------------------------------------- strategies


class _GradInOutputLayout(torch.autograd.Function):
    """Identity whose backward hands SDPA the output's gradient in the output's own strides. torch caches cuDNN
    attention's backward graph keyed on q, k, v's strides alone (cudnn/MHA.cpp), but the graph bakes in dO's: a call
    with the same q, k, v strides and a dO of other strides (Flux's single blocks take dO from a slice of [attn, mlp],
    its double blocks a dense one) runs at the first call's dO strides: wrong gradients, or an illegal memory access
    (tools/check_cudnn_grad_layout.py). With dO in o's strides, and o's set by q's, the key decides them all."""

    @staticmethod
    def forward(ctx, out):
        ctx.stride = out.stride()
        return out.view_as(out)

    @staticmethod
    def backward(ctx, g):
        # compiled: the strides seen while tracing need not be the ones inductor gives g, so copy always
        if g.stride() == ctx.stride and not torch.compiler.is_compiling():
            return g
        return torch.empty_strided(g.shape, ctx.stride, dtype=g.dtype, device=g.device).copy_(g)


def grad_in_output_layout(out, cudnn_possible: bool):
    """SDPA's output, its gradient put in the output's strides where cuDNN may run the SDPA (see above)."""
    return _GradInOutputLayout.apply(out) if cudnn_possible and out.requires_grad else out


def sdpa(q, k, v, cudnn_possible: bool):
    """F.scaled_dot_product_attention, its output's gradient put in the output's strides where cuDNN may run it."""
    return grad_in_output_layout(F.scaled_dot_product_attention(q, k, v), cudnn_possible)


class CPStrategy:
    name = "none"

    def __init__(self, rank: int = 0, world: int = 1, device: torch.device | None = None, sdpa_backend="auto",
                 mesh=None):
        # rank, world: within the CP group; mesh: the 1-D CP DeviceMesh (mesh["cp"]); without one (op bench,
        # scripts), the whole process group is the CP group
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"{self.name}: CP rank {rank} of world {world} (need world >= 1, 0 <= rank < world)")
        if mesh is not None and mesh.size() != world:
            raise ValueError(f"{self.name}: CP world {world} but the CP mesh has {mesh.size()} ranks")
        self.rank, self.world, self.device, self.mesh = rank, world, device, mesh
        self.sdpa_backend = sdpa_backend
        self.group = None if world == 1 else (mesh.get_group() if mesh is not None else dist.group.WORLD)

    @property
    def cudnn_possible(self) -> bool:
        """Whether cuDNN's attention may run this strategy's SDPA (named, or torch's pick under auto on CUDA)."""
        return self.sdpa_backend in ("auto", "cudnn") and self.device is not None and self.device.type == "cuda"

    def attention(self, q, k, v):  # (B, H, S_l, D) each
        return sdpa(q, k, v, self.cudnn_possible)

    def sdpa_shapes(self, b: int, h: int, s_local: int, d: int) -> tuple[tuple, tuple]:
        """(q, k/v) shapes of this rank's SDPA call, from its local (B, H, S_l, D) q, k, v."""
        return (b, h, s_local, d), (b, h, s_local, d)

    def sdpa_kernel(self, b: int, h: int, s_local: int, d: int, dtype, device) -> str:
        """The kernel SDPA runs for this rank's call (cudnn, flash, efficient, math): torch's own choice
        (`_fused_sdp_choice`) under this strategy's backend setting. torch's ring runs that kernel's ring variant."""
        qs, kvs = self.sdpa_shapes(b, h, s_local, d)
        q, kv = torch.empty(qs, dtype=dtype, device=device), torch.empty(kvs, dtype=dtype, device=device)
        with CPStrategy.step_context(self):  # the backend setting alone (the ring's context needs no part in this)
            choice = SDPBackend(torch._fused_sdp_choice(q, kv, kv))
        return {SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.FLASH_ATTENTION: "flash",
                SDPBackend.EFFICIENT_ATTENTION: "efficient", SDPBackend.MATH: "math"}.get(choice, choice.name.lower())

    def step_context(self):
        """Entered around forward and backward of every step."""
        stack = contextlib.ExitStack()
        if self.sdpa_backend != "auto":
            stack.enter_context(sdpa_kernel([SDPA_BACKENDS[self.sdpa_backend]]))
        return stack


class AllGatherKV(CPStrategy):
    name = "allgather-kv"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.sdpa_backend == "auto" and self.device is not None and self.device.type == "cuda":
            # On torch 2.11 the training step faulted (illegal memory access) with cuDNN SDPA and queries
            # shorter than keys, though isolated calls pass (docs/archive/2026-12-02-h200-timing.md): pin flash.
            self.sdpa_backend = "flash"

    def sdpa_shapes(self, b, h, s_local, d):
        return (b, h, s_local, d), (b, h, s_local * self.world, d)  # local queries x all keys

    def attention(self, q, k, v):
        if self.world > 1:
            k, v = _GatherSeq.apply(torch.stack([k, v]), self.group, self.world).unbind(0)
        return sdpa(q, k, v, self.cudnn_possible)  # local queries x all keys


class Ulysses(CPStrategy):
    name = "ulysses"

    def __init__(self, *args, qkv: str = "fused", **kwargs):
        super().__init__(*args, **kwargs)
        self.qkv = qkv  # fused: q, k and v to heads in one all-to-all; separate: one each (DeepSpeed-Ulysses')

    def sdpa_shapes(self, b, h, s_local, d):
        full = (b, h // self.world, s_local * self.world, d)  # H/W heads over the whole sequence
        return full, full

    def attention(self, q, k, v):
        if self.world == 1:
            return sdpa(q, k, v, self.cudnn_possible)
        if q.shape[1] % self.world:
            raise ValueError(f"ulysses: {q.shape[1]} heads are not divisible by the CP world {self.world} (it shards "
                             "heads: pick a world dividing them, or allgather-kv)")
        if self.qkv == "fused":  # the same bytes in a third of the collectives (each pays a launch and a latency)
            q, k, v = _SeqToHeads.apply(torch.stack([q, k, v]), self.group, self.world).unbind(0)
        else:
            q, k, v = (_SeqToHeads.apply(x[None], self.group, self.world)[0] for x in (q, k, v))
        out = sdpa(q, k, v, self.cudnn_possible)  # (B, H/W, S, D)
        return _HeadsToSeq.apply(out[None], self.group, self.world)[0]


class TorchRing(CPStrategy):
    """torch.distributed.tensor.experimental.context_parallel: ring attention over the CP mesh."""

    name = "torch"

    def __init__(self, *args, rotate: str = "allgather", **kwargs):
        super().__init__(*args, **kwargs)
        from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

        # Flux attention is non-causal: head-tail load balancing only helps causal masks.
        _cp_options.enable_load_balance = False
        set_rotate_method(rotate)
        if self.mesh is None:  # used outside the (dp, cp) mesh (scripts, tests): the whole world is the CP group
            from torch.distributed.device_mesh import init_device_mesh

            self.mesh = init_device_mesh(self.device.type, (self.world,), mesh_dim_names=("cp",))
        # context_parallel shards its buffers in place; ours are sharded already, and torch >= 2.10
        # raises IndexError on an empty buffer list, so it gets a throwaway one.
        self._dummy = torch.zeros(self.world, device=self.device)
        if self.sdpa_backend == "auto":
            # On torch 2.11 the ring's cuDNN path (SDPA's default on H200) gives wrong gradients and then
            # faults (tests/test_gpu.py, docs/archive/2026-12-02-h200-w1.md): pin flash, which is exact.
            self.sdpa_backend = "flash"

    def attention(self, q, k, v):
        # Looked up at call time: inside the context torch has replaced F.scaled_dot_product_attention.
        return grad_in_output_layout(torch.nn.functional.scaled_dot_product_attention(q, k, v), self.cudnn_possible)

    def step_context(self):
        from torch.distributed.tensor.experimental import context_parallel

        stack = super().step_context()  # the dummy is restored on exit, so one serves every step
        stack.enter_context(context_parallel(self.mesh, buffers=[self._dummy], buffer_seq_dims=[0]))
        return stack


# ---------------------------------------------------------------- the attention processor


class CPAttnProcessor:
    """diffusers' FluxAttnProcessor with the attention call handed to a CP strategy, and the QKV
    projection and the attention call (its collectives included) wrapped in timing regions."""

    def __init__(self, strategy: CPStrategy, timer: StepTimer | None = None):
        self.strategy = strategy
        self.timer = timer or StepTimer(cuda=False, enabled=False)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        assert attention_mask is None, "Flux attention is unmasked"
        q, k, v = self.project(attn, hidden_states, encoder_hidden_states, image_rotary_emb)  # (B, H, S_l, Dh)
        call = self.timer.open("sdpa")
        q, k, v = call.enter(q, k, v)
        (out,) = call.exit(self.strategy.attention(q, k, v))
        out = out.transpose(1, 2).flatten(2, 3).to(q.dtype)  # (B, S_l, H * Dh)

        joint = encoder_hidden_states is not None  # double block: image stream + text stream
        if not joint:
            return out
        t = encoder_hidden_states.shape[1]
        ctx, img = out[:, :t], out[:, t:]
        img = attn.to_out[1](attn.to_out[0](img.contiguous()))
        return img, attn.to_add_out(ctx.contiguous())

    def project(self, attn, hidden_states, encoder_hidden_states=None, image_rotary_emb=None):
        """q, k, v of the local tokens, normed and rotated, each (B, H, S_l, Dh) ([text, image] in a double block)."""
        joint = encoder_hidden_states is not None
        call = self.timer.open("qkv_gemm")
        streams = call.enter(hidden_states, *([encoder_hidden_states] if joint else []))
        proj = [*_project(attn, streams[0], added=False), *(_project(attn, streams[1], added=True) if joint else ())]
        proj = call.exit(*proj)  # 3 or 6 tensors, each (B, S_l, H * Dh)

        q, k, v = (x.unflatten(-1, (-1, attn.head_dim)) for x in proj[:3])  # (B, Si_l, H, Dh)
        q, k = attn.norm_q(q), attn.norm_k(k)
        if joint:
            eq, ek, ev = (x.unflatten(-1, (-1, attn.head_dim)) for x in proj[3:])  # (B, St_l, H, Dh)
            eq, ek = attn.norm_added_q(eq), attn.norm_added_k(ek)
            q, k, v = (torch.cat([e, x], dim=1) for e, x in ((eq, q), (ek, k), (ev, v)))  # [text, image]
        if image_rotary_emb is not None:
            q, k = apply_rope(q, image_rotary_emb), apply_rope(k, image_rotary_emb)  # fp64 in fp64 runs
        return tuple(x.transpose(1, 2) for x in (q, k, v))


def _project(attn, x, added: bool):
    """q, k, v of one stream: one fused GEMM (chunked views) or three separate ones."""
    if attn.fused_projections:
        return (attn.to_added_qkv if added else attn.to_qkv)(x).chunk(3, dim=-1)
    names = ("add_q_proj", "add_k_proj", "add_v_proj") if added else ("to_q", "to_k", "to_v")
    return tuple(getattr(attn, n)(x) for n in names)


def apply_cp(model, strategy: CPStrategy, timer: StepTimer | None = None) -> None:
    """Install the CP attention processor on every attention of the model."""
    for attn in model.attentions():
        attn.set_processor(CPAttnProcessor(strategy, timer))


# ---------------------------------------------------------------- the conditioning path, split over the CP group


class _SplitFeaturesLinear(torch.autograd.Function):
    """y = x W^T + b for a conditioning vector x (B, D) that every CP rank holds alike: each rank computes
    1/W of the output features, one all-gather joins them. Backward: a reduce-scatter sums the ranks'
    gradients of the rank's features (their local losses differ) -> its slice of dW, db; the rest of dW, db
    stays zero (DDP's average over ranks then gives the mean gradient, as for every other weight). dx is the
    same on every rank: all-reduced, / W, the gradient of the mean loss (DDP's average leaves it so)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, world, rank):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.world, ctx.rank = group, world, rank
        y = F.linear(x, weight.chunk(world)[rank], bias.chunk(world)[rank])  # (B, F/W)
        b = y.shape[0]
        out = y.new_empty((world * b, y.shape[1]))  # collectives concatenate along dim 0
        _all_gather_single(out, y.contiguous(), group=group)
        return out.view(world, b, -1).transpose(0, 1).reshape(b, -1)  # (W, B, F/W), rank r's features -> (B, F)

    @staticmethod
    def backward(ctx, g):  # g (B, F): the gradient of this rank's local loss
        x, weight = ctx.saved_tensors
        world, rank = ctx.world, ctx.rank
        b, f = g.shape
        send = g.reshape(b, world, f // world).transpose(0, 1).reshape(world * b, -1)  # (W * B, F/W): chunk j -> rank j
        mine = send.new_empty((b, f // world))
        _reduce_scatter_single(mine, send, group=ctx.group)  # (B, F/W): summed over the ranks' losses
        dw, db = torch.zeros_like(weight), weight.new_zeros(f)
        dw.chunk(world)[rank].copy_(mine.t() @ x)  # (F/W, D)
        db.chunk(world)[rank].copy_(mine.sum(0))
        dx = mine @ weight.chunk(world)[rank]  # (B, D): this slice's share of the summed gradient
        dist.all_reduce(dx, group=ctx.group)
        return dx / world, dw, db, None, None, None


def _split_forward(lin, group, world, rank, x):
    return _SplitFeaturesLinear.apply(x, lin.weight, lin.bias, group, world, rank)


def split_conditioning(model, strategy: CPStrategy) -> None:
    """Split the AdaLN modulation linears (the conditioning path: its cost does not shrink with the tokens a rank
    holds) over the CP group, from outside the model: each linear's forward is replaced, its parameters kept."""
    for lin in model.conditioning_linears():
        if strategy.world > 1:
            lin.forward = functools.partial(_split_forward, lin, strategy.group, strategy.world, strategy.rank)
