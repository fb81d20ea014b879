"""OpTimingCallback: step and op timings of every training step, to summary.json and the logger.

Per step it opens the module's StepTimer before the step and closes it after (optimizer
included), reads the events once (one synchronize), then gathers every rank's figures and loss
in one small all-gather. Rank 0 logs them (Lightning logger API) and keeps the summary.
Warm-up steps are run and their loss kept, but their timings stay out of the statistics.
"""

import traceback
from pathlib import Path

import torch
from lightning.pytorch import Callback

from flux_cp.results import RunSummary


class OpTimingCallback(Callback):
    def __init__(self, summary_path: Path, header: dict, warmup_steps: int, flush_every: int = 5):
        self.summary = RunSummary(summary_path, header, warmup_steps)
        self.warmup_steps = warmup_steps
        self.flush_every = flush_every
        self._keys: list[str] | None = None

    def on_train_start(self, trainer, pl_module):  # after the module's on_fit_start built the strategy
        # the backend the strategy actually uses (`auto` can be pinned, e.g. flash under torch CP)
        self.summary.header["sdpa_backend"] = pl_module.strategy.sdpa_backend

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        pl_module.timer.start_step()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        timer = pl_module.timer
        timer.end_step()
        local = timer.read()  # the step's only synchronize
        keys = self._keys = self._keys or sorted(local)
        row = [local[k] for k in keys] + [outputs["loss"].item()]
        vec = torch.tensor(row, device=pl_module.device, dtype=torch.float64)
        every = trainer.strategy.all_gather(vec).reshape(-1, len(keys) + 1).cpu()  # (W, M + 1)
        loss = every[:, -1].mean().item()  # equal shards: global loss = mean of the ranks' losses
        if trainer.global_rank != 0:
            return
        vmax, vmin = every[:, :-1].max(0).values.tolist(), every[:, :-1].min(0).values.tolist()
        self.summary.add_step(batch_idx, loss, local, dict(zip(keys, vmax)), dict(zip(keys, vmin)))
        if trainer.logger is not None:
            logged = {"loss": loss, "warmup": float(batch_idx < self.warmup_steps), **local}
            if trainer.world_size > 1:
                logged |= {f"rank_max/{k}": v for k, v in zip(keys, vmax)}
                logged |= {f"rank_min/{k}": v for k, v in zip(keys, vmin)}
            trainer.logger.log_metrics(logged, step=batch_idx)
        if (batch_idx + 1) % self.flush_every == 0:
            self.summary.write(complete=False)

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank != 0:
            return
        self.summary.write(complete=True)  # before the logger is finalised: a wandb failure loses nothing
        exp = getattr(trainer.logger, "experiment", None)
        if exp is not None and hasattr(exp, "summary"):  # medians in wandb's run table
            for name, m in self.summary.metrics().items():
                exp.summary[f"{name}/median"] = m["median"]

    def on_exception(self, trainer, pl_module, exception):
        if trainer.global_rank == 0:
            err = "".join(traceback.format_exception_only(type(exception), exception)).strip()
            self.summary.write(complete=False, error=err)
