"""SyncDebugCallback (--sync-debug, CUDA): where the training loop makes the host wait for the device.

A wait drains the device's queue: until the host issues the next kernels, the device idles, and a
step that should be device bound shows idle time. torch's sync debug mode warns at every
synchronizing CUDA call (stream or device synchronize, a blocking copy, `.item()`, `nonzero`, ...).
From the first measured step to the end of training this callback counts those warnings by call site
(the innermost frames of the Python stack). The timing callback's wait on a finished step's last event
is on purpose and left out (flux_cp.measure.timing.sync_allowed); its loss read is not (it must not wait).
Result: summary.json `syncs`.
"""

import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from lightning.pytorch import Callback

from callbacks.timing import OpTimingCallback

MESSAGE = "called a synchronizing CUDA operation"
FRAMES = 5  # innermost frames kept per site


def _where(frame: traceback.FrameSummary) -> str:
    path = Path(frame.filename)
    parts = path.parts
    for anchor in ("site-packages", "flux_cp", "callbacks", "scripts"):  # shortest readable path
        if anchor in parts:
            i = parts.index(anchor)
            path = Path(*parts[i + (anchor == "site-packages"):])
            break
    return f"{path}:{frame.lineno} {frame.name}"


class SyncDebugCallback(Callback):
    def __init__(self, timing: OpTimingCallback, first_step: int):
        self.timing = timing
        self.first = first_step  # the first measured step
        self.sites: Counter = Counter()
        self.steps = 0
        self._show = None
        self._on = False

    def _record(self, message, category, filename, lineno, file=None, line=None):
        if MESSAGE not in str(message):
            return self._show(message, category, filename, lineno, file, line)
        stack = [f for f in traceback.extract_stack()[:-1] if f.filename != warnings.__file__]  # the caller's frames
        self.sites[tuple(_where(f) for f in stack[-FRAMES:])] += 1

    def on_train_start(self, trainer, pl_module):
        self._show = warnings.showwarning
        warnings.showwarning = self._record
        warnings.filterwarnings("always", message=f".*{MESSAGE}")  # every call, not once per location

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx >= self.first:
            self.steps += 1
            if not self._on:  # on from here to the end: the loop between steps (data, hooks) is watched too
                torch.cuda.set_sync_debug_mode("warn")
                self._on = True

    def on_train_end(self, trainer, pl_module):
        self._stop()

    def on_exception(self, trainer, pl_module, exception):
        self._stop()

    def _stop(self):
        if self._on:
            torch.cuda.set_sync_debug_mode(0)
            self._on = False
        if self._show is not None:
            warnings.showwarning, self._show = self._show, None
        total = sum(self.sites.values())
        self.timing.summary.header["syncs"] = {
            "steps": self.steps,
            "per_step": total / self.steps if self.steps else None,
            "sites": [{"count": n, "stack": list(stack)} for stack, n in self.sites.most_common()],
        }
