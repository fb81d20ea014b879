"""The LightningModule: one Flux training step under a CP strategy.

Manual optimization, so that the strategy's context (torch's context_parallel patches SDPA for
forward AND backward) wraps both passes of the step. Weights are replicated on every CP rank;
DDP averages their gradients.
"""

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from flux_cp.config import BenchConfig
from flux_cp.data import SyntheticFlow
from flux_cp.model import FluxDiT, image_ids, text_ids
from flux_cp.parallel import apply_cp, make_strategy, shard
from flux_cp.timing import StepTimer


class FluxCPModule(L.LightningModule):
    def __init__(self, cfg: BenchConfig):
        super().__init__()
        self.cfg = cfg
        self.automatic_optimization = False
        torch.manual_seed(cfg.data.seed)  # same random init at every world size and strategy
        self.model = FluxDiT(cfg.model)
        self.strategy = None  # set in on_fit_start, once ranks and devices are known
        self.timer = StepTimer(cuda=False, enabled=False)

    def train_dataloader(self):
        run = self.cfg.run
        return DataLoader(SyntheticFlow(self.cfg.data, self.cfg.model, run.warmup_steps + run.steps), batch_size=None)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=self.cfg.run.lr)

    def on_fit_start(self):
        run, data = self.cfg.run, self.cfg.data
        rank, world = self.global_rank, self.trainer.world_size
        self.timer = StepTimer(cuda=self.device.type == "cuda", enabled=run.timing)
        self.strategy = make_strategy(run.cp, rank, world, self.device, run.sdpa_backend, run.rotate)
        apply_cp(self.model, self.strategy, self.timer)
        # Each rank's RoPE angles: its own text and image tokens' positions, in [text, image] order.
        txt = shard(text_ids(data.text_tokens), 0, rank, world)
        img = shard(image_ids(data.image_height, data.image_width), 0, rank, world)
        self.rope = self.model.rope(txt.to(self.device), img.to(self.device))  # (cos, sin), (S_l, head_dim)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        r, w = self.strategy.rank, self.strategy.world
        x, target, text = (shard(batch[k], 1, r, w) for k in ("x_t", "target", "text"))  # (B, S/W, .)
        with self.strategy.step_context():
            pred = self.model(x, text, batch["pooled"], batch["t"], self.rope)
            # Mean over local image tokens. Shards are equal, so the mean of the W local losses is the
            # global mean, and DDP's average of local gradients is the gradient of the global loss.
            loss = F.mse_loss(pred.float(), target.float())
            opt.zero_grad(set_to_none=True)
            self.manual_backward(loss)
        opt.step()
        if self.cfg.run.dump_grads and batch_idx == 0 and self.global_rank == 0:
            self._dump_grads()
        return {"loss": loss.detach()}

    def _dump_grads(self):
        grads = {n: p.grad.detach().double().cpu() for n, p in self.model.named_parameters() if p.grad is not None}
        path = Path(self.cfg.run.output) / "grads_step0.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(grads, path)
