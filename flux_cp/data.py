"""Synthetic rectified-flow batches, identical on every CP rank (each rank then takes its shard).

Step i's global batch (dp x batch_size samples) comes from a generator seeded with (seed, i) on the
device it is made on (the training device by default, the CPU in loader workers), so every rank,
world size, strategy and harness sees the same data and their losses can be compared step by
step. Like a distributed sampler over the dp dimension, dp rank d takes samples
[d * batch_size, (d + 1) * batch_size) of it: a dp=2 run trains on the same two samples as one
process with batch_size 2.
"""

import dataclasses

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from flux_cp.config import DataConfig, ModelConfig

DTYPES = {"bf16-true": torch.bfloat16, "32-true": torch.float32, "64-true": torch.float64}  # --precision


def make_batch(data: DataConfig, model: ModelConfig, step: int, device="cpu") -> dict[str, torch.Tensor]:
    """Step `step`'s batch, made on `device` by that device's generator (CPU and CUDA draw different values)."""
    g = torch.Generator(device).manual_seed(data.seed * 1_000_003 + step)
    b, si, st = data.batch_size, data.image_tokens, data.text_tokens

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    latents = randn(b, si, model.in_channels)  # x0: clean packed latents
    noise = randn(b, si, model.in_channels)  # x1
    t = torch.sigmoid(randn(b))  # logit-normal timesteps, as in SD3/Flux training
    tb = t[:, None, None]
    return {
        "x_t": (1 - tb) * latents + tb * noise,  # (B, Si, C) point on the straight path
        "target": noise - latents,  # (B, Si, C) velocity d x_t / d t
        "t": t,  # (B,)
        "text": randn(b, st, model.text_dim),  # (B, St, Dt) stand-in T5 embeddings
        "pooled": randn(b, model.pooled_dim),  # (B, Dp) stand-in CLIP pooled
    }


class SyntheticFlow(IterableDataset):
    """Batches made in fp32 (the same values at every precision), handed out in the run's dtype: Lightning's
    precision plugin would otherwise cast them on the host between steps, into pageable memory (measured on an
    H200: 3 casts of 3-6 ms each per step, then a pageable copy)."""

    def __init__(self, data: DataConfig, model: ModelConfig, steps: int, dp_rank: int = 0, dp: int = 1,
                 dtype: torch.dtype = torch.float32, device="cpu"):
        self.data, self.model, self.steps = data, model, steps
        self.dp_rank, self.dp, self.dtype, self.device = dp_rank, dp, dtype, device

    def __iter__(self):
        b = self.data.batch_size
        whole = dataclasses.replace(self.data, batch_size=b * self.dp)  # the global batch
        worker = get_worker_info()  # loader worker j of n makes steps j, j + n, ...: the loader takes them in turn
        first, every = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        for i in range(first, self.steps, every):
            batch = make_batch(whole, self.model, i, self.device)
            # this dp rank's samples; contiguous copies, so that a worker sends (and the loader pins) only those
            yield {k: v[self.dp_rank * b : (self.dp_rank + 1) * b].to(self.dtype, copy=True) for k, v in batch.items()}

    def __len__(self):
        return self.steps


def device_batches(data: DataConfig, model: ModelConfig, steps: int, dp_rank: int, dp: int, dtype: torch.dtype,
                   device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Every step's batch, made on the training device before the loop starts (--loader device): fetching one is
    indexing a list, so neither harness has loader work in its host path. Flux at batch 1: ~5 MB a step in bf16."""
    return list(SyntheticFlow(data, model, steps, dp_rank, dp, dtype, device))


def make_loader(data: DataConfig, model: ModelConfig, steps: int, dp_rank: int, dp: int, workers: int, pin: bool,
                dtype: torch.dtype = torch.float32) -> DataLoader:
    """Worker processes make the batches (on GPU by default: one batch is ~10-30 ms of CPU, mostly Flux's
    512 x 4096 text embeddings, which in the main process, or in too few workers, would pace a short step;
    measured on an H200 at W=8: a 28 ms loop around a 9 ms step with one worker). Batches come in step order.
    pin: from pinned memory Lightning's non_blocking copy is asynchronous; from pageable memory CUDA syncs
    the stream first, draining the device at every step start (docs/archive/2026-12-03-h200-zero.md)."""
    return DataLoader(SyntheticFlow(data, model, steps, dp_rank, dp, dtype), batch_size=None, pin_memory=pin,
                      num_workers=workers)
