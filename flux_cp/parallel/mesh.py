"""The 2-D device mesh (dp, cp) and how weights are kept in sync over it (the Lightning strategies that apply this
are in flux_cp/train/strategies.py; the bare loop, flux_cp/train/bare.py, applies it without Lightning).

    ranks = devices x num_nodes = dp x cp        mesh order ("dp", "cp"): cp innermost

A CP group is `cp` consecutive global ranks. Lightning numbers ranks node by node
(global rank = node_rank x devices + local_rank), so whenever --cp-degree divides --devices every
CP group lies inside one node: the chatty per-layer attention collectives stay on NVLink and only
the once-per-step gradient sync crosses nodes. Ranks of a CP group share a sample (each holds a
1/cp slice of its tokens); the dp groups hold different samples.

Weights, `--weights`:
- ddp:  replicated on every rank; Lightning's DDPStrategy all-reduces (averages) gradients over all
        dp x cp ranks.
- zero: replicated like ddp, but the AdamW state is sharded over all dp x cp ranks (ZeRO-1, torch's
        ZeroRedundancyOptimizer): each rank steps its share of the parameters and broadcasts them.
- fsdp: FSDP2 `fully_shard` over all dp x cp ranks (torchtitan's flattened dp_shard x cp mesh), each
        block a unit, then the root: per block, parameters are all-gathered before its forward and
        backward, and gradients reduce-scattered (averaged) after its backward (--fsdp-*: shard_weights).
Either way the update is the gradient of the global mean loss: see FluxCPModule.training_step.
"""

import torch
import torch.distributed as dist
from torch import nn


def build_mesh(device_type: str, dp: int, cp: int):
    """The (dp, cp) DeviceMesh over all ranks, or None without a process group (one plain process)."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (dp, cp), mesh_dim_names=("dp", "cp"))


def shard_weights(model: nn.Module, mesh, run) -> None:
    """FSDP2 over a 1-D mesh of all ranks: each transformer block is one all-gather/reduce-scatter unit, the
    root (embedders, final norm and projection) one more, as torchtitan wraps its blocks. run's FSDP settings, as a
    team tunes them at depth (defaults: FSDP2's own behaviour):
    - fsdp_reshard_last K: the last K blocks keep their gathered parameters after the forward (the backward starts
      with them: no second all-gather; K blocks' parameters whole meanwhile; torchtitan leaves the last one so)
    - fsdp_prefetch N: each block's forward explicitly prefetches the next N blocks' all-gathers, its backward the
      previous N (FSDP2's implicit prefetch is one block, issued when the block before starts)
    - fsdp_reduce_dtype fp32: gradients reduce-scattered in fp32 (bf16 sums lose bits over many ranks; 2x bytes)
    - fsdp_cpu_offload: the shards, their gradients and so AdamW's state in host memory (pinned on a GPU): each
      all-gather copies its shard up first, each reduce-scatter its result down"""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    reshard_last = run.fsdp_reshard_last
    reduce = {"param": None, "fp32": torch.float32}[run.fsdp_reduce_dtype]
    policy = MixedPrecisionPolicy(reduce_dtype=reduce)  # param_dtype None: the run's precision casts the weights
    pinned = mesh.device_type == "cuda"  # pinned host memory: the copies up and down run asynchronously
    offload = CPUOffloadPolicy(pin_memory=pinned) if run.fsdp_cpu_offload else OffloadPolicy()
    blocks = [*model.double_blocks, *model.single_blocks]
    for i, blk in enumerate(blocks):
        fully_shard(blk, mesh=mesh, reshard_after_forward=i < len(blocks) - reshard_last, mp_policy=policy,
                    offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=policy, offload_policy=offload)
    prefetch = run.fsdp_prefetch
    if prefetch:
        for i, blk in enumerate(blocks):
            if nxt := blocks[i + 1: i + 1 + prefetch]:
                blk.set_modules_to_forward_prefetch(nxt)
            if prev := blocks[max(0, i - prefetch): i][::-1]:
                blk.set_modules_to_backward_prefetch(prev)


def build_optimizer(model: nn.Module, run, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over what this rank updates: every trainable parameter (ddp, fsdp: its shards), or its ZeRO share
    (zero)."""
    # one kernel per parameter group (CUDA's, or the CPU's where FSDP keeps the shards on the host), so the step is not
    # host bound
    fused = device.type == "cuda" or run.fsdp_cpu_offload
    # --step-graph: the step count on the device, so that a replayed step advances it (flux_cp/train/step_graph.py)
    capturable = {"capturable": True} if run.step_graph else {}
    params = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters alone
    if run.weights == "zero2" and dist.is_available() and dist.is_initialized():
        from flux_cp.parallel.zero2 import ShardedAdamW

        share = run.zero2_forward_share if run.zero2_gather == "forward" else 0.0  # of the gathers, under the forward
        return ShardedAdamW(model, full_grads=run.dump_grads, forward_share=share,
                            bucket_bytes=int(run.zero2_bucket_mb * 2**20), lr=run.lr, fused=fused, **capturable)
    if run.weights == "zero" and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=run.lr, fused=fused,
                                       parameters_as_bucket_view=run.zero_bucket_view, **capturable)
    return torch.optim.AdamW(params, lr=run.lr, fused=fused, **capturable)


def optimizer_numel(opt: torch.optim.Optimizer) -> int:
    """Parameters this rank's optimizer steps (under ZeRO: its local share)."""
    local = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps the rank's own optimizer in .optim
    return sum(p.numel() for g in local.param_groups for p in g["params"])


def _whole(p: nn.Parameter, t: torch.Tensor) -> torch.Tensor:
    """t (p or its gradient) whole: FSDP's DTensor gathered, a --cp tp shard put together (flux_cp.parallel.tp)."""
    if hasattr(t, "full_tensor"):
        return t.full_tensor()
    if hasattr(p, "_tp"):
        from flux_cp.parallel.tp import full_tensor

        return full_tensor(t, p._tp)
    return t


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient, fp64 on CPU. Collective under FSDP and --cp tp: call on all ranks."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        out[name] = _whole(p, p.grad).detach().double().cpu()
    return out


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole tensor, fp64 on CPU. Collective under FSDP and --cp tp: call on all ranks."""
    return {name: _whole(p, p).detach().double().cpu() for name, p in model.named_parameters()}
