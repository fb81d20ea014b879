"""Activation checkpointing, applied to a built model from outside it (as the parallel strategies are).

    none       every block keeps its activations for the backward
    full       a block keeps only its inputs; its forward runs again inside the backward (torch's non-reentrant
               checkpoint), collectives included: memory ~ one block's activations, ~1/3 more compute
    selective  an op-level policy (torchtitan's): the outputs of the GEMMs and of attention are kept, the cheap
               elementwise ops (norms, RoPE, GELU, modulation) recomputed: most of full's memory saving for a
               fraction of its recompute
    --checkpoint-fraction f: the first round(f x N) blocks of the N checkpointed, the rest not (full and selective)

The blocks' forward is replaced on the instance (parameter names, state dicts and FSDP's units unchanged): the
checkpoint sits inside the module's hooks, so FSDP2 gathers a block's parameters for its recompute with its backward.
MFU stays in model FLOPs (recompute not counted); the hardware FLOPs add recompute_flops' share.
"""

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from flux_cp.measure.flops import covered

MODES = ("none", "selective", "full")

# kept by selective checkpointing: the matmuls (the FLOPs) and attention (its kernel's own saved statistics with it)
_SAVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}
if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):  # the CPU's flash kernel
    _SAVE.add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
# --fp8: torchao's float8 GEMMs and the amax reductions that scale them (torchtitan's list): else selective would
# recompute every FP8 GEMM in the backward, full checkpointing's cost
_SAVE |= {torch.ops.aten._scaled_mm.default, torch.ops.aten.max.default}


def _policy(ctx, func, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if func in _SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_policy)


def apply_checkpointing(model, mode: str, fraction: float = 1.0) -> int:
    """Checkpoint model's blocks in `mode`; returns how many blocks it covers."""
    blocks = [*model.double_blocks, *model.single_blocks]
    blocks = blocks[: covered(len(blocks), mode, fraction)]
    for blk in blocks:
        forward = blk.forward  # the class's, bound (or an earlier wrapper's: the CP processors sit below it)
        kwargs = {"use_reentrant": False, "preserve_rng_state": False}  # Flux's blocks draw no random numbers
        if mode == "selective":
            kwargs["context_fn"] = _selective_context
        blk.forward = functools.partial(_checkpointed, forward, kwargs)
    return len(blocks)


def _checkpointed(forward, kwargs, *args, **inputs):
    return checkpoint(forward, *args, **inputs, **kwargs)
