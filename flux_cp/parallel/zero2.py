"""--weights zero2: ZeRO-2 over all dp x cp ranks, bucketed, its collectives overlapped with the backward.

What DDP + ZeRO-1 (--weights zero) sends a step: every gradient all-reduced (2 (W-1)/W x its bytes on a ring) and
then every parameter broadcast by its owner (104 broadcasts for Flux's 2 + 4 blocks, 2.6 GB in bf16). Here, as
DeepSpeed's ZeRO-2 and FSDP's reduce-scatter + all-gather: parameters and gradients live in flat buckets (~25 MiB,
in reverse registration order: about the order the backward produces them); each bucket's gradient is
reduce-scattered as soon as its last parameter's gradient is accumulated (a post-accumulate-grad hook), then AdamW
steps this rank's 1/W of the bucket and its parameters are all-gathered, all on a side stream under the rest of the
backward (a bucket holds layers the rest of the backward no longer reads); the optimizer step waits for the
gathers. The bytes of one all-reduce, no per-parameter traffic, the optimizer's work and state 1/W, no DDP wrapper,
nothing on the host that a CUDA graph cannot replay (--step-graph).

What the gradients cost the compute stream, at every W (the model's gradient bytes, 2.6 GB for Flux's 2 + 4 blocks,
are whole on every rank until reduced): one copy each, autograd's gradient into its bucket, as FSDP2 copies into
its reduce-scatter buffer; the mean is taken on this rank's reduced 1/W. DDP's way (buckets zeroed each step,
gradients accumulated into them in place, each divided by W before its all-reduce) passes over those bytes three
times more (zero; read, add, write; divide) where one GPU's step (gradients set to None) passes none.

    opt = ShardedAdamW(model, lr=..., fused=True)   # rebinds the parameters into flat buckets (the default group)
    opt.zero_grad(); loss.backward(); opt.step()    # the step every harness runs (flux_cp/train/step.py)
    with opt.no_sync(): loss.backward()             # gradient accumulation: summed in the buckets, synced by the next
    opt.flush()                                     # after the last step (forward_share > 0: parameters whole again)

forward_share > 0 (--zero2-gather forward, --zero2-forward-share) moves that share of the all-gathers out of the
backward into the next step's forward, as FSDP prefetches: the forward's first call issues the gathers of its first
forward_share of the buckets on the side stream, in forward order, and each unit of the forward (an embedder, a
block, the output layers) waits for its own buckets' gathers before it runs; the rest, the last layers' (reduced
first, read last), stay under the backward. At W=8 the backward cannot hide both the reduce-scatters and the gathers
(docs/archive/2026-12-04e-h200-session.md): the forward takes all or part of the gathers (about as much
communication as compute in each phase: the backward is ~2/3 of the step and carries every reduce-scatter).
Between steps those parameters are stale (this rank's shards updated, the rest not yet gathered): flush() gathers
them whole.
"""

import contextlib
import functools
import weakref

import torch
import torch.distributed as dist
from torch import nn

from flux_cp.measure.ledger import consumed

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb


class _Bucket:
    def __init__(self, params: list[nn.Parameter], world: int, rank: int, index: int):
        self.params, self.index = params, index  # index: its parameter group in ShardedAdamW
        numel = sum(p.numel() for p in params)
        self.size = -(-numel // world) * world  # padded to a multiple of W: equal shards
        p0 = params[0]
        self.flat = torch.zeros(self.size, dtype=p0.dtype, device=p0.device)  # the parameters
        self.grad = torch.zeros_like(self.flat)  # their gradients
        offset, self.grads = 0, []
        for p in params:  # each parameter a view of the bucket from here on, its gradient copied into one
            n = p.numel()
            self.flat[offset:offset + n].copy_(p.detach().reshape(-1))
            p.data = self.flat[offset:offset + n].view_as(p)
            self.grads.append(self.grad[offset:offset + n].view_as(p))
            offset += n
        shard = self.size // world
        self.param_shard = self.flat.detach()[rank * shard:(rank + 1) * shard]  # AdamW's parameter: a view
        self.param_shard.grad = self.grad[rank * shard:(rank + 1) * shard]  # the reduce-scatter's output, in place
        self.filled: set[int] = set()  # positions of the parameters whose gradient this backward has copied in
        self.work = None  # its collectives in flight (issued under the backward, waited in step)
        self.stale = False  # gathered in the forward: its shard updated, its parameters not yet gathered
        self.gathered = None  # gathered in the forward: the gather issued, waited by the first unit reading the bucket


def _accumulated(ref: weakref.ref, index: int, position: int, param: nn.Parameter) -> None:
    if (opt := ref()) is not None:
        opt._accumulated(opt.buckets[index], position, param)


# Forward pre-hooks of the forward's gathers, run eagerly: inside a compiled block dynamo would trace their stream waits
@torch._dynamo.disable
def _gather_all(ref: weakref.ref, module, args) -> None:
    if (opt := ref()) is not None:
        opt._gather_stale()


@torch._dynamo.disable
def _wait_gathered(ref: weakref.ref, indices: tuple, module, args) -> None:
    if (opt := ref()) is not None:
        for i in indices:
            opt._wait(opt.buckets[i])


def _units(model: nn.Module):
    """The forward's units, each run whole before the next: the model's children, module lists expanded (Flux: the
    embedders, every block, the output norm and projection)."""
    for child in model.children():
        yield from (child if isinstance(child, nn.ModuleList) else [child])


class ShardedAdamW(torch.optim.AdamW):
    """AdamW over this rank's shard of every bucket (the parameters it steps: 1/W of the model's), one parameter
    group a bucket; see the module's docstring. After a backward every parameter's gradient is its bucket's view;
    zero_grad sets them None (the next backward's are copied over the bucket). full_grads=True all-gathers the
    reduced gradients too (for the numerics dumps only: it doubles the traffic)."""

    def __init__(self, model: nn.Module, group=None, full_grads: bool = False, forward_share: float = 0.0,
                 bucket_bytes: int = BUCKET_BYTES, **adamw):
        if not 0 <= forward_share <= 1:
            raise ValueError(f"ShardedAdamW: forward_share={forward_share}: in [0, 1]")
        self.group = group
        self.accumulating = False  # in no_sync: gradients summed into the buckets, not synced
        self.world, rank = dist.get_world_size(group), dist.get_rank(group)
        self.full_grads = full_grads
        self.buckets: list[_Bucket] = []
        chunk, nbytes = [], 0
        for p in reversed([p for p in model.parameters() if p.requires_grad]):
            chunk.append(p)
            nbytes += p.numel() * p.element_size()
            if nbytes >= bucket_bytes:
                self.buckets.append(_Bucket(chunk, self.world, rank, len(self.buckets)))
                chunk, nbytes = [], 0
        if chunk:
            self.buckets.append(_Bucket(chunk, self.world, rank, len(self.buckets)))
        # The hooks reach the optimizer by a weak reference: a parameter's hooks are held by C++ (autograd), which the
        # garbage collector cannot see, so a strong one made parameter -> hook -> optimizer -> bucket -> parameter a
        # cycle never collected (an in-process sweep kept every earlier zero2 run's model and state: +5-8 GiB each)
        ref = weakref.ref(self)
        for b in self.buckets:
            for j, p in enumerate(b.params):
                p.register_post_accumulate_grad_hook(lambda p, i=b.index, j=j: _accumulated(ref, i, j, p))
        super().__init__([{"params": [b.param_shard]} for b in self.buckets], **adamw)
        # the forward gathers the first forward_share of the buckets in its order (the last in the backward's, at
        # least one); the rest, the last layers' (reduced first, needed last), are gathered under the backward
        n = len(self.buckets)
        self.gathered_in_backward = n - max(1, round(forward_share * n)) if forward_share else n
        device = self.buckets[0].flat.device if self.buckets else torch.device("cpu")
        # On CUDA each bucket's update and gather run on a side stream, under the rest of the backward
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        if forward_share:  # the forward issues the gathers and each unit waits for its own buckets'
            model.register_forward_pre_hook(functools.partial(_gather_all, ref))
            where = {id(p): b.index for b in self.buckets for p in b.params}
            for unit in _units(model):
                if idx := tuple(sorted({where[id(p)] for p in unit.parameters() if id(p) in where})):
                    unit.register_forward_pre_hook(functools.partial(_wait_gathered, ref, idx))

    def _accumulated(self, b: _Bucket, j: int, p: nn.Parameter) -> None:
        """p's gradient is accumulated: autograd's own tensor (p.grad was None: autograd stole the backward's output,
        no copy) copied into its bucket, the one write a step of it there (a bucket view kept as p.grad made
        autograd add into it in place, after zero_grad had zeroed the bucket: three passes over the model's gradient
        bytes a step where this is one; 2.6 GB a pass for Flux's 2 + 4 blocks, at every W)."""
        g = b.grads[j]
        if p.grad is not g:  # (it is g in a second backward before a step: autograd added into the view)
            g.copy_(p.grad)
            p.grad = g  # the bucket's view from here on; autograd's tensor freed
        if self.accumulating:  # a later backward adds into it and syncs the sum
            return
        b.filled.add(j)
        if len(b.filled) == len(b.params):  # its gradient is whole: sync and update it under the rest of the backward
            self._sync(b)

    @contextlib.contextmanager
    def _on_side(self):
        """On CUDA: the side stream current, after what the compute stream has issued so far (a backend whose work
        waits nothing, the fake group's, is ordered by this too); on CPU: nothing."""
        if self.side is None:
            yield
            return
        self.side.wait_stream(torch.cuda.current_stream(self.side.device))
        with torch.cuda.stream(self.side):
            yield

    def _sync(self, b: _Bucket) -> None:
        """Reduce-scatter b's gradient, step AdamW on this rank's shard, all-gather b's parameters (or, if the forward
        gathers b, mark it stale): issued at once, on CUDA on the side stream (after what
        the backward has issued so far), waited in step()."""
        rs = dist.reduce_scatter_tensor(b.param_shard.grad, b.grad, group=self.group, async_op=True)
        with self._on_side():
            rs.wait()  # this stream (or, on CPU, the host) waits for the reduce-scatter
            # The mean over ranks: this rank's reduced 1/W divided, on the side stream (DDP's hook divides the whole
            # gradient before its all-reduce, a pass over the model's bytes on the compute stream; bf16 and fp32 sums
            # do not overflow where fp16's could, the reason it divides first)
            b.param_shard.grad.div_(self.world)
            groups = self.param_groups
            self.param_groups = [groups[b.index]]  # AdamW's step over b's group alone
            try:
                super().step()
            finally:
                self.param_groups = groups
            b.work = []
            if b.index < self.gathered_in_backward:  # in place: this rank's shard is where the gathered bucket puts it
                b.work.append(dist.all_gather_into_tensor(b.flat, b.param_shard, group=self.group, async_op=True))
            else:
                b.stale = True
            if self.full_grads:
                b.work.append(dist.all_gather_into_tensor(b.grad, b.param_shard.grad, group=self.group, async_op=True))

    def _gather_stale(self) -> None:
        """Issue every stale bucket's all-gather, in forward order (the buckets are in backward order), on CUDA on
        the side stream (after this rank's update there)."""
        with self._on_side():
            for b in reversed(self.buckets):
                if b.stale:
                    work = dist.all_gather_into_tensor(b.flat, b.param_shard, group=self.group, async_op=True)
                    if self.side is not None:
                        work.wait()  # this (side) stream waits for the gather (the fake group's: nothing)
                        b.gathered = torch.cuda.Event()
                        b.gathered.record(self.side)
                    else:
                        b.gathered = work
                    b.stale = False

    def _wait(self, b: _Bucket) -> None:
        """The current stream (on CPU the host) waits for b's gather, if one is in flight."""
        if b.gathered is None:
            return
        consumed(b.flat)  # the ledger's wait stamp: where the forward needs the gather (not the phase's end)
        if isinstance(b.gathered, torch.cuda.Event):
            torch.cuda.current_stream(self.side.device).wait_event(b.gathered)
        else:
            b.gathered.wait()
        b.gathered = None

    def flush(self) -> None:
        """Every parameter whole again (the forward's gathers leave them stale after a step): after the last step,
        before reading them (a checkpoint, the numerics dumps). Nothing to do when the backward gathers them all."""
        self._gather_stale()
        for b in self.buckets:
            self._wait(b)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes that only sum their gradients into the buckets (--micro-batches: all but a
        step's last micro-batch); the next backward outside it adds its own and reduces the sum, once."""
        self.accumulating = True
        try:
            yield
        finally:
            self.accumulating = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Every parameter's gradient None, its bucket left as it is: the backward's gradients are copied over it
        (set_to_none=False is ignored: zeroing the buckets would be a pass over the model's bytes for nothing)."""
        for b in self.buckets:
            for p in b.params:
                p.grad = None
            b.filled.clear()
            b.work = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for b in self.buckets:
            if b.work is None:  # a parameter without a gradient this step: its bucket goes now, that gradient zero
                for j, g in enumerate(b.grads):
                    if b.params[j].grad is None:  # (one an earlier micro-batch gave is in the bucket already)
                        g.zero_()
                self._sync(b)
        if self.side is not None:
            torch.cuda.current_stream(self.side.device).wait_stream(self.side)
        for b in self.buckets:
            for w in b.work:
                w.wait()
        return loss
