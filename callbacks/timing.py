"""OpTimingCallback: step and op timings of every training step, to summary.json and the logger.

Per step it opens the module's StepTimer before the step and closes it after (optimizer
included), reads the events once (one synchronize), then gathers every rank's figures and loss
in one small all-gather. Rank 0 logs them (Lightning logger API) and keeps the summary.
Warm-up steps are run and their loss kept, but their timings stay out of the statistics; so do
profiled steps (--profile: extra steps right after warm-up, slowed by the profiler itself).

Each measured step has a kind (`step_kind`), the same on every rank:
- "timed": op regions on -> step_ms, host_ms, sdpa_*/qkv_gemm_* (the normal step);
- "plain": regions off -> step_ms/host_ms when --timing false; with --timing-ab (instrumentation
  overhead, alternating in one process) every other step is plain -> step_untimed_ms;
- "probe" (CUDA, every --idle-probe-every'th step): the host runs ahead of the device ->
  device_busy_ms, from which summary.json's device idle fraction comes.

Every rank keeps the (gathered) summary, so that whichever rank fails can write what was measured.
"""

import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

from flux_cp.failures import error_kind, error_line
from flux_cp.results import RunSummary


class OpTimingCallback(Callback):
    def __init__(
        self,
        summary_path: Path,
        header: dict,
        warmup_steps: int,
        profile_steps: int = 0,
        timing_ab: bool = False,
        idle_probe_every: int = 4,
        flush_every: int = 1,
    ):
        self.summary = RunSummary(summary_path, header, warmup_steps + profile_steps)
        self.warmup_steps = warmup_steps
        self.skip = warmup_steps + profile_steps  # steps kept out of the statistics
        self.timing_ab = timing_ab
        self.idle_probe_every = idle_probe_every
        self.flush_every = flush_every
        self.last: dict[str, float] = {}  # this rank's figures of the last step (the profiler reads them)
        self._host_ms = 0.0  # last step's issue time: how far ahead a probe must hold the stream
        self._kind = "timed"  # this step's kind, set at its start
        self._t0 = 0.0

    def step_kind(self, batch_idx: int, cuda: bool, timing: bool) -> str:
        j = batch_idx - self.skip  # index among measured steps
        every = self.idle_probe_every
        if j >= 0 and cuda and every and j % every == every - 1:
            return "probe"
        if not timing or (j >= 0 and self.timing_ab and j % 2 == 1):
            return "plain"
        return "timed"

    def on_train_start(self, trainer, pl_module):  # after the module's on_fit_start built the strategy
        # the backend the strategy actually uses (`auto` can be pinned, e.g. flash under torch CP)
        self.summary.header["sdpa_backend"] = pl_module.strategy.sdpa_backend
        self._t0 = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        timer = pl_module.timer
        kind = self._kind = self.step_kind(batch_idx, timer.clock.cuda, timer.enabled)
        probe_ms = 1.5 * self._host_ms + 2.0 if kind == "probe" else 0.0  # longer than the host needs to issue
        timer.start_step(regions=kind == "timed", probe_ms=probe_ms)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        timer, kind = pl_module.timer, self._kind
        timer.end_step()
        local = timer.read()  # the step's only synchronize
        self._host_ms = local["host_ms"]
        if kind == "probe":
            local = {"device_busy_ms": local["step_ms"]}
        elif kind == "plain" and self.timing_ab and timer.enabled:
            local = {"step_untimed_ms": local["step_ms"], "host_untimed_ms": local["host_ms"]}
        self.last = local
        keys = sorted(local)  # same on every rank: the kind is
        row = [local[k] for k in keys] + [outputs["loss"].item()]
        vec = torch.tensor(row, device=pl_module.device, dtype=torch.float64)
        every = trainer.strategy.all_gather(vec).reshape(-1, len(keys) + 1).cpu()  # (W, M + 1)
        loss = every[:, -1].mean().item()  # equal shards of equally many samples: global loss = mean over dp x cp ranks
        vmax, vmin = every[:, :-1].max(0).values.tolist(), every[:, :-1].min(0).values.tolist()
        rank0 = dict(zip(keys, every[0, :-1].tolist()))  # the summary's per-step figures are rank 0's
        self.summary.add_step(batch_idx, loss, rank0, dict(zip(keys, vmax)), dict(zip(keys, vmin)))
        if batch_idx + 1 == self.warmup_steps:  # warm-up wall time: compilation, autotuning, allocator growth
            self.summary.header["warmup_s"] = time.perf_counter() - self._t0
            self.summary.header["warmup_steps"] = self.warmup_steps
        if trainer.global_rank != 0:
            return
        if trainer.logger is not None:
            logged = {"loss": loss, "warmup": float(batch_idx < self.skip), **local}
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
        if hasattr(trainer.logger, "log_summary"):  # medians in wandb's run table (ResilientWandbLogger)
            medians = {f"{name}/median": m["median"] for name, m in self.summary.metrics().items()}
            trainer.logger.log_summary(medians | self.summary.derived())

    def on_exception(self, trainer, pl_module, exception):
        self.record_failure(trainer.global_rank, exception)

    def record_failure(self, rank: int, exception: BaseException):
        """Any rank: its error (kind, failing shape) next to the steps measured so far, `complete: false`."""
        data = self.summary.header["config"]["data"]
        seq_len = data["image_height"] * data["image_width"] + data["text_tokens"]
        shape = {"seq_len": seq_len, "batch": data["batch_size"], "world": self.summary.header["world_size"]}
        self.summary.record_error(rank, error_line(exception), error_kind(exception), shape)
