"""The 2-D device mesh (dp, cp), how weights are kept in sync over it, and the Lightning strategy for that.

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
        backward, and gradients reduce-scattered (averaged) after its backward.
Either way the update is the gradient of the global mean loss: see FluxCPModule.training_step.
"""

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch import nn

from flux_cp.simulate import allreduce_hook, is_fake


def build_mesh(device_type: str, dp: int, cp: int):
    """The (dp, cp) DeviceMesh over all ranks, or None without a process group (one plain process)."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (dp, cp), mesh_dim_names=("dp", "cp"))


def shard_weights(model: nn.Module, mesh) -> None:
    """FSDP2 over a 1-D mesh of all ranks: each transformer block is one all-gather/reduce-scatter unit, the
    root (embedders, final norm and projection) one more, as torchtitan wraps its blocks."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6 kept it under _composable
        from torch.distributed._composable.fsdp import fully_shard

    for blk in (*model.double_blocks, *model.single_blocks):
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)


def build_optimizer(model: nn.Module, run, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over what this rank updates: every parameter (ddp, fsdp: its shards), or its ZeRO share (zero)."""
    fused = device.type == "cuda"  # one kernel per parameter group on CUDA, so the step is not host bound
    params = list(model.parameters())
    if run.weights == "zero" and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=run.lr, fused=fused)
    return torch.optim.AdamW(params, lr=run.lr, fused=fused)


def optimizer_numel(opt: torch.optim.Optimizer) -> int:
    """Parameters this rank's optimizer steps (under ZeRO: its local share)."""
    local = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps the rank's own optimizer in .optim
    return sum(p.numel() for g in local.param_groups for p in g["params"])


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient, fp64 on CPU. Collective under FSDP (DTensor grads): call on all ranks."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name] = g.detach().double().cpu()
    return out


class _Simulable:
    """What Lightning's strategies need to run a simulated rank (flux_cp.simulate) unchanged:
    - Python objects (log dirs, ...) are broadcast from rank 0 with broadcast_object_list; over the fake group a
      rank r != 0 would receive garbage sizes and allocate them. A simulated job's ranks all hold what rank 0
      holds (one config, one folder), so under the fake group the object is this rank's own.
    - A simulated rank r is the job's one process: it logs and prints as rank 0 would (rank_zero_only)."""

    def broadcast(self, obj, src: int = 0):
        return obj if is_fake() else super().broadcast(obj, src)

    def set_world_ranks(self) -> None:
        super().set_world_ranks()
        if is_fake():
            from lightning.pytorch.utilities.rank_zero import rank_zero_only
            from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

            rank_zero_only.rank = utils_rank_zero_only.rank = 0


class ModelParallel(_Simulable, ModelParallelStrategy):
    pass


class DDPWithHook(_Simulable, DDPStrategy):
    """Lightning's DDPStrategy with DDP's gradient all-reduce as a comm hook (flux_cp.simulate.allreduce_hook:
    torch's allreduce_hook with a future the fake group can complete), so real and simulated ranks run one code.
    Lightning registers comm hooks on CUDA only; this one runs on gloo and on the fake group too."""

    def _register_ddp_hooks(self) -> None:
        self.model.register_comm_hook(None, allreduce_hook)


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole tensor, fp64 on CPU. Collective under FSDP (DTensor params): call on all ranks."""
    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = t.detach().double().cpu()
    return out


def lightning_strategy(run):
    """The Lightning strategy for `run.weights`.

    fsdp: Lightning's ModelParallelStrategy, with all dp x cp ranks mapped onto its `data_parallel` dim
    (tensor_parallel = 1). Its mesh dim is then exactly the flattened (dp, cp) mesh FSDP2 shards over, and
    the strategy already does what FSDP2 needs (configure_model before the optimizer, no DDP wrapper), so no
    subclass is needed; the (dp, cp) view that CP groups and data use is built by build_mesh on the same ranks.
    """
    import datetime

    backend = "nccl" if run.accelerator == "gpu" else "gloo"
    timeout = datetime.timedelta(seconds=run.timeout_s)  # a collective that never matches fails the run
    if run.simulate_world:  # the fake group exists already (flux_cp.simulate); Lightning keeps it
        backend = "fake"
    if run.weights == "fsdp":  # FSDP needs a process group even at world size 1
        return ModelParallel(data_parallel_size=run.world_size, tensor_parallel_size=1,
                                     process_group_backend=backend, timeout=timeout)
    # torch's CP needs a process group (its device mesh) even at world size 1
    if run.world_size > 1 or run.cp == "torch":
        return DDPWithHook(process_group_backend=backend, timeout=timeout)
    return "auto"


def lightning_precision(run) -> dict:
    """The Trainer's precision arguments. Lightning's ModelParallelStrategy accepts precisions from a list of names
    without 64-true, though its DoublePrecision plugin works as bf16-true's HalfPrecision does there (module.to(dtype)
    after configure_model's fully_shard; default dtype in init and forward): under fsdp it is given as a plugin."""
    if run.weights == "fsdp" and run.precision == "64-true":
        from lightning.pytorch.plugins import DoublePrecision

        return {"precision": None, "plugins": [DoublePrecision()]}
    return {"precision": run.precision}
