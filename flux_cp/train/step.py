"""One Flux training step under a CP strategy, with no harness around it.

The Lightning module (train/module.py) and the bare loop (train/bare.py) both run this object, so the two
harnesses time the same code and their losses agree step for step:

    step = FluxStep(cfg, model, device, cp_mesh, timer)    # strategy installed, compiled, RoPE angles made
    loss = step(model_or_ddp, optimizer, batch, backward)   # zero_grad, forward, loss, backward, optimizer step
                                                            # (--step-graph: replayed from one CUDA graph)

--micro-batches k: the step's batch (this data-parallel group's samples) runs as k micro-batches, each
its forward and backward, the gradients summed on the rank and synced by the last micro-batch's backward alone;
one optimizer step.
"""

import contextlib
import functools
import os

import torch
import torch.nn.functional as F

from flux_cp.config import BenchConfig
from flux_cp.data import DTYPES
from flux_cp.measure.timing import StepTimer
from flux_cp.model import FluxDiT, image_ids, text_ids
from flux_cp.parallel import contention
from flux_cp.parallel.cp import apply_cp, shard, split_conditioning
from flux_cp.parallel.registry import make_strategy
from flux_cp.parallel.tp import apply_tp, dp_sync_off, rope_tables
from flux_cp.parallel.ulysses_overlap import overlap_single_blocks
from flux_cp.train.checkpointing import apply_checkpointing
from flux_cp.train.fp8 import apply_fp8, cache_frozen_fp8, precompute_fp8_scales
from flux_cp.train.lora import apply_lora
from flux_cp.train.step_graph import StepGraph


def init_device(accelerator: str) -> torch.device:
    """Where the weights are drawn: on the GPU the run trains on (LOCAL_RANK, set by Lightning's launcher, torchrun and
    the bare launcher), since the CPU's serial RNG takes ~15 s per run for Flux.1-sized blocks."""
    if accelerator == "gpu" and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def build_model(cfg: BenchConfig) -> FluxDiT:
    """The same random init at every world size, strategy and harness (per device type), in fp32: the harness casts
    it to the run's precision. --fp8: its token linears converted (flux_cp/train/fp8.py); --lora-rank: adapters on
    them, the rest frozen (flux_cp/train/lora.py)."""
    torch.manual_seed(cfg.data.seed)
    with torch.device(init_device(cfg.run.accelerator)):
        model = FluxDiT(cfg.model)
    apply_lora(model, cfg.run)  # before any sharding: the strategies see the frozen base and its adapters
    apply_fp8(model, cfg.run.fp8, cfg.run.fsdp_fp8_all_gather)  # likewise (FSDP2 and DDP wrap them); a LoRA base's
    return model


def compile_model(model: FluxDiT, run) -> None:
    """torch.compile each block (torchtitan's way) or the whole model; the attention processor and its collectives
    are traced with them."""
    scope = [model] if run.compile_scope == "model" else [*model.double_blocks, *model.single_blocks]
    for m in scope:
        overlapped = run.ulysses_overlap and (m is model or m in model.single_blocks)
        if run.fsdp_fp8_all_gather and m in model.single_blocks:
            m.forward = _unaliased(m.forward)
        m.compile(**compile_options(run, overlapped))


def _unaliased(forward):
    """A single block's forward whose two outputs do not alias: diffusers returns two slices of one tensor, and
    AOTAutograd (torch 2.11-2.13) refuses such outputs from a graph with tensor-subclass inputs (FSDP2's float8
    all-gather weights). The text slice (St of S tokens) is copied."""
    @functools.wraps(forward)
    def wrapped(*args, **kwargs):
        c, h = forward(*args, **kwargs)
        return c.clone(), h
    return wrapped


def compile_options(run, overlapped: bool = False) -> dict:
    """torch.compile's arguments for the run's settings; overlapped: the code holds --ulysses-overlap's blocks."""
    mode = run.compile_mode if run.compile_backend == "inductor" and run.compile_mode != "default" else None
    options = None
    if overlapped and run.compile_backend == "inductor":
        # inductor's peak-memory reordering (on by default) moves each wait_tensor up to its collective, which would
        # undo --ulysses-overlap in the backward (tests/test_overlap.py); options replace a mode, so they carry its own
        options = {**(torch._inductor.list_mode_options(mode) if mode else {}), "reorder_for_peak_memory": False}
        mode = None
    return {"mode": mode, "options": options, "backend": run.compile_backend}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Tensors made without a dtype inside the step take the run's (what Lightning's bf16-true and 64-true
    precision plugins do around training_step), so both harnesses compute alike."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class FluxStep:
    def __init__(self, cfg: BenchConfig, model: FluxDiT, device: torch.device, cp_mesh, timer: StepTimer,
                 no_sync=None):
        """no_sync: where the harness holds the DDP wrapper (Lightning's strategy), its context for a backward
        without the gradient sync (strategy.block_backward_sync); the bare loop hands the wrapper to each call."""
        run, data = cfg.run, cfg.data
        self.micro_batches, self.no_sync = run.micro_batches, no_sync
        self.micro = data.batch_size // self.micro_batches  # samples a forward (checks.resolve: k divides them)
        rank, world = (cp_mesh.get_local_rank(), cp_mesh.size()) if cp_mesh is not None else (0, 1)  # in the CP group
        self.timer = timer
        self.strategy = make_strategy(run.cp, rank, world, device, run.sdpa_backend, run.rotate, mesh=cp_mesh,
                                      ulysses_qkv=run.ulysses_qkv)
        apply_cp(model, self.strategy, timer)
        if run.cp == "tp":  # its weights were sharded before DDP and the optimizer (flux_cp.parallel.tp.shard_model)
            ids = (text_ids(data.text_tokens).to(device), image_ids(data.image_height, data.image_width).to(device))
            dtype = torch.promote_types(DTYPES[run.precision], torch.float32)
            apply_tp(model, self.strategy, timer, rope_tables(model, *ids, world, dtype))
        if run.ulysses_overlap:
            overlap_single_blocks(model, self.strategy)
        if run.split_conditioning:
            split_conditioning(model, self.strategy)
        cache_frozen_fp8(model)  # --fp8 under LoRA: the frozen base cast once, now that it is in the run's precision
        self.fp8_scales = model if run.fsdp_fp8_all_gather else None  # whose float8 scales each step precomputes
        # below compile (dynamo traces the checkpoint), above the strategies' processors (recomputed with the block)
        self.checkpointed = apply_checkpointing(model, run.checkpointing, run.checkpoint_fraction)
        if run.compile:
            compile_model(model, run)
        # --contention: each collective's traffic on the GPU beside the compute; none left by an earlier run in-process
        self.contention = contention.start(run, device) if run.contention else contention.stop()
        # --step-graph: eager through warm-up but its last step, which captures (flux_cp/train/step_graph.py)
        # --grad-bucket-view: gradients stay views into DDP's buckets, zeroed in place (freed, the next backward would
        # allocate new ones and DDP copy them in again)
        self.set_to_none = not run.grad_bucket_view
        self.graph = StepGraph(run.warmup_steps - 1, set_to_none=self.set_to_none) if run.step_graph else None
        self.split = (rank, world)  # this rank's place in its CP group (a simulated rank's too: its fake group)
        # Each rank's RoPE angles: its own text and image tokens' positions, in [text, image] order.
        txt = shard(text_ids(data.text_tokens), 0, *self.split)
        img = shard(image_ids(data.image_height, data.image_width), 0, *self.split)
        dtype = torch.promote_types(DTYPES[run.precision], torch.float32)  # fp32 under bf16, fp64 in fp64 runs
        self.rope = model.rope(txt.to(device), img.to(device), dtype)  # (cos, sin), (S_l, head_dim)
        m = cfg.model  # the kernel this rank's attention runs (summary.json sdpa_kernel), not only the setting
        self.sdpa_kernel = self.strategy.sdpa_kernel(self.micro, m.num_heads, data.seq_len // world, m.head_dim,
                                                     DTYPES[run.precision], device)

    def __call__(self, model, opt, batch: dict, backward=torch.Tensor.backward) -> torch.Tensor:
        """One optimizer step on this rank's shard of `batch`; returns the local loss (detached, on the device).
        model: what the forward calls (the DDP wrapper in the bare loop, the module itself under Lightning)."""
        if self.graph is not None:
            return self.graph(self._step, model, opt, batch, backward)
        return self._step(model, opt, batch, backward)

    @property
    def replays(self) -> bool:
        """Whether the next call replays the step graph (no Python of the step runs: no optimizer.step call)."""
        return self.graph is not None and self.graph.graph is not None

    def finish(self, opt) -> None:
        """After the last step: the parameters whole (ZeRO-2 gathering in the forward leaves them stale between
        steps), before anything reads them."""
        if hasattr(opt, "flush"):
            opt.flush()

    def close(self) -> None:
        """Release what the step holds on the device that must go before the process group does (the step graph)."""
        if self.graph is not None:
            self.graph.release()
        if self.contention is not None:
            contention.stop()

    def _step(self, model, opt, batch: dict, backward) -> torch.Tensor:
        # Before the forward: FSDP2 leaves the root unit unsharded after it, where a model.zero_grad would clear the
        # unsharded copies and the sharded grads (AdamW's) would sum over steps. ZeRO's param_groups hold every param.
        opt.zero_grad(set_to_none=self.set_to_none)
        k, m, losses = self.micro_batches, self.micro, []
        for j in range(k):
            last = j == k - 1
            # Micro-batch j's samples, then this rank's tokens of them: (m, S/W, .)
            part = {key: v[j * m:(j + 1) * m] for key, v in batch.items()} if k > 1 else batch
            x, target, text = (shard(part[key], 1, *self.split) for key in ("x_t", "target", "text"))
            with self._sync_off(model, opt) if not last else contextlib.nullcontext(), self.strategy.step_context():
                pred = model(x, text, part["pooled"], part["t"], self.rope)
                # Mean over local image tokens of this rank's samples. Every rank holds the same number of tokens
                # (equal sequence shards of equally many samples), so the mean of the dp x cp local losses is the
                # global mean, and averaging gradients over all dp x cp ranks (DDP all-reduce, FSDP reduce-scatter)
                # gives the gradient of the global loss; a micro-batch's is 1/k of it (equal micro-batches), its
                # gradient summed with the others'. In fp32 at least (bf16 runs), fp64 in fp64 runs.
                dtype = torch.promote_types(pred.dtype, torch.float32)
                loss = F.mse_loss(pred.to(dtype), target.to(dtype))
                if k > 1:
                    loss = loss / k
                # Once a step, around the last micro-batch's backward (the one that syncs the gradients): the
                # "forward" phase holds the earlier micro-batches' forward and backward passes
                if last:
                    self.timer.mark("forward_end")
                backward(loss)
                if last:
                    self.timer.mark("backward_end")  # DDP's bucket all-reduces are consumed here (the reducer waits)
            losses.append(loss.detach())
        opt.step()
        if self.fp8_scales is not None:  # the new weights' amaxes, all-reduced once, before the next step's gathers
            precompute_fp8_scales(self.fp8_scales)
        return losses[0] if k == 1 else torch.stack(losses).sum()

    def _sync_off(self, model, opt) -> contextlib.ExitStack:
        """A backward whose gradients stay on the rank, summed into the next micro-batch's (all but a step's last):
        DDP's no_sync (the forward's wrapper, or the harness's), FSDP2's gradient sync off, ZeRO-2's no_sync, the
        TP-sharded weights' own dp all-reduce off (--cp tp at dp > 1)."""
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        stack = contextlib.ExitStack()
        stack.enter_context(dp_sync_off())
        inner = getattr(opt, "optimizer", opt)  # Lightning's optimizer wraps a copy; ZeRO-2's hooks hold this one
        if hasattr(inner, "no_sync"):
            stack.enter_context(inner.no_sync())
        if isinstance(model, FSDPModule):
            model.set_requires_gradient_sync(False)
            stack.callback(model.set_requires_gradient_sync, True)
        if isinstance(model, DistributedDataParallel):
            stack.enter_context(model.no_sync())
        elif self.no_sync is not None:
            stack.enter_context(self.no_sync())
        return stack
