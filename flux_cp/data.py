"""Synthetic rectified-flow batches, identical on every CP rank (each rank then takes its shard).

Step i's batch comes from a generator seeded with (seed, i), so every rank, world size and
strategy sees the same data and their losses can be compared step by step.
"""

import torch
from torch.utils.data import IterableDataset

from flux_cp.config import DataConfig, ModelConfig


def make_batch(data: DataConfig, model: ModelConfig, step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(data.seed * 1_000_003 + step)
    b, si, st = data.batch_size, data.image_tokens, data.text_tokens
    latents = torch.randn(b, si, model.in_channels, generator=g)  # x0: clean packed latents
    noise = torch.randn(b, si, model.in_channels, generator=g)  # x1
    t = torch.sigmoid(torch.randn(b, generator=g))  # logit-normal timesteps, as in SD3/Flux training
    tb = t[:, None, None]
    return {
        "x_t": (1 - tb) * latents + tb * noise,  # (B, Si, C) point on the straight path
        "target": noise - latents,  # (B, Si, C) velocity d x_t / d t
        "t": t,  # (B,)
        "text": torch.randn(b, st, model.text_dim, generator=g),  # (B, St, Dt) stand-in T5 embeddings
        "pooled": torch.randn(b, model.pooled_dim, generator=g),  # (B, Dp) stand-in CLIP pooled
    }


class SyntheticFlow(IterableDataset):
    def __init__(self, data: DataConfig, model: ModelConfig, steps: int):
        self.data, self.model, self.steps = data, model, steps

    def __iter__(self):
        for i in range(self.steps):
            yield make_batch(self.data, self.model, i)

    def __len__(self):
        return self.steps
