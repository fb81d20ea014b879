"""KernelProfileCallback: torch.profiler over the first measured steps, a Chrome trace per rank,
and the kernel breakdown (flux_cp.measure.profiling) in summary.json next to the callback's own figures.

It runs after OpTimingCallback in the callback list: that callback reads profiled steps at their
end (not one step late, as measured steps), so both describe the same steps.
"""

import statistics
from pathlib import Path

import torch
from lightning.pytorch import Callback
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from callbacks.timing import OpTimingCallback
from flux_cp.measure.profiling import REGIONS, breakdown, load_trace


class KernelProfileCallback(Callback):
    def __init__(self, timing: OpTimingCallback, out_dir: Path, first_step: int, num_steps: int):
        self.timing = timing
        self.out_dir = Path(out_dir)
        self.first, self.last = first_step, first_step + num_steps - 1
        self.prof = None
        self._range = None
        self._event_calls: dict[str, list[float]] = {}  # the callback's per-call figures, same steps

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.first <= batch_idx <= self.last:
            return
        if batch_idx == self.first:
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if pl_module.device.type == "cuda" else [])
            self.prof = profile(activities=acts)
            self.prof.__enter__()
            pl_module.timer.annotate = True
        self._range = record_function(f"flux_cp::step{batch_idx}").__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.prof is None or not self.first <= batch_idx <= self.last:
            return
        self._range.__exit__(None, None, None)
        for k, v in self.timing.last.items():
            if k.endswith("_call_ms"):
                self._event_calls.setdefault(k[: -len("_call_ms")], []).append(v)
        if batch_idx == self.last:
            self._finish(trainer, pl_module)

    def _finish(self, trainer, pl_module):
        pl_module.timer.annotate = False
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        self.prof.__exit__(None, None, None)
        trace = self.out_dir / "traces" / f"rank{trainer.global_rank}.json"
        trace.parent.mkdir(parents=True, exist_ok=True)
        self.prof.export_chrome_trace(str(trace))
        self.prof = None
        if trainer.global_rank != self.timing.report_rank:
            return
        result = breakdown(load_trace(trace))
        events = {k: statistics.median(v) for k, v in self._event_calls.items()}
        kernels = result.get("ops_call_ms", {})
        # fidelity: CUDA-event region per call vs the kernels launched inside it, same steps
        result["fidelity"] = {
            r: {"events_ms": events[r], "kernels_ms": kernels[r], "diff_pct": 100 * (events[r] / kernels[r] - 1)}
            for r in REGIONS
            if r in events and kernels.get(r)
        }
        result["trace_files"] = [f"traces/rank{r}.json" for r in range(trainer.world_size)]
        self.timing.summary.header["profile"] = result
