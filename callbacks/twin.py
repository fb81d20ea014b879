"""BareTwinCallback (--interleave-bare N): the bare loop's step inside the Lightning run, in alternating blocks.

A Lightning run and its bare twin in separate runs compare only as far as the host keeps its speed between them: the
H200 machines lent here are KVM guests whose single-thread speed moved 3.2-6.9 us per tiny op within seconds, and
five interleaved pairs per cell gave 95% intervals 7-15 points wide at W >= 2
(docs/archive/2026-12-04-h200-harness.md). Here a second copy of the model, set up as the bare loop sets up its own
(flux_cp.train.bare.wrap_for_training: DDP with the same comm hook, or ZeRO; the same strategy, compile setting and
precision), trains N bare steps after every N measured Lightning steps, on the batch Lightning just used, one event
pair per step and no ledger, as the bare loop's plain steps. Both harnesses' steps then see the same host within
seconds. A block's first step starts behind Lightning's last one and is left out. summary.json `interleaved_bare`:
the twin's step_ms per step, and Lightning's plain-step median over the twin's with a 95% bootstrap interval. The
twin trains its own copy: the Lightning run's losses are untouched. Its blocks run between Lightning steps, so the
loop_ms / data_ms of a step before a block include it, and its copy of the model and optimizer state is in the run's
peak memory (summary.json `memory`).
"""

import torch
from lightning.pytorch import Callback

from flux_cp.data import DTYPES
from flux_cp.measure.timing import StepTimer, sync_allowed
from flux_cp.runs.results import pooled_overhead
from flux_cp.train.bare import wrap_for_training
from flux_cp.train.step import FluxStep, build_model, default_dtype


class BareTwinCallback(Callback):
    def __init__(self, cfg, every: int, timing):
        self.cfg, self.every, self.timing = cfg, every, timing  # timing: the OpTimingCallback (its skip, summary)
        timing.twin = self  # it writes this callback's figures into summary.json after its own reads
        self._twin = None  # (what the step calls, optimizer, FluxStep, StepTimer)
        self._records: list[tuple[int, dict]] = []  # (place in its block, step record)

    def on_train_start(self, trainer, pl_module):
        run, device = self.cfg.run, pl_module.device
        # the same weights as the Lightning model's start (build_model seeds), without moving the run's RNG
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            model = build_model(self.cfg).to(device, DTYPES[run.precision])
        cp_mesh = pl_module.mesh["cp"] if pl_module.mesh is not None else None
        dp_mesh = pl_module.mesh["dp"] if pl_module.mesh is not None else None
        fwd, opt = wrap_for_training(model, run, device, cp_mesh, dp_mesh)
        timer = StepTimer(cuda=device.type == "cuda", enabled=False)  # plain bare steps: no ledger
        self._twin = (fwd, opt, FluxStep(self.cfg, model, device, cp_mesh, timer), timer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        j = batch_idx - self.timing.skip  # index among measured steps
        if j < 0 or (j + 1) % self.every:
            return
        fwd, opt, step, timer = self._twin
        with default_dtype(DTYPES[self.cfg.run.precision]):
            for i in range(self.every):
                timer.start_step(regions=False)
                self._records.append((i, timer.end_step(step(fwd, opt, batch))))

    def figures(self, lightning_step_ms: list[float]) -> dict:
        """summary.json `interleaved_bare`, after the loop (the timing callback calls it once it has read its steps)."""
        twin = []
        if self._twin is not None:
            timer = self._twin[3]
            with sync_allowed(timer.cuda):  # after the loop: a wait here stalls nothing
                twin = [timer.read(rec, wait=True)["step_ms"] for i, rec in self._records if i > 0]
        out = {"every": self.every, "steps": len(twin), "step_ms": twin}
        if twin and lightning_step_ms:
            est, ci = pooled_overhead(lightning_step_ms, twin)
            out |= {"lightning_steps": len(lightning_step_ms), "overhead_pct": est, "ci95_pct": ci}
        return out
