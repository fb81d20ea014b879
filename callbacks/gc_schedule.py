"""GcScheduleCallback (--gc-every N): Python's garbage collector on a schedule, as torchtitan's gc_freq.

Python collects when object allocations cross a threshold, wherever the loop happens to be: a pause of
a few to tens of ms in a step's host path, which a host-bound step (short per-rank steps at high CP
degrees) pays in full. With N > 0 automatic collection is off from the first step, and a young-generation
collection runs after every Nth step instead, at a place the timing figures can see (after_ms, gc_ms).
"""

import gc

from lightning.pytorch import Callback


class GcScheduleCallback(Callback):
    def __init__(self, every: int):
        self.every = every
        self._was_enabled = True

    def on_train_start(self, trainer, pl_module):
        self._was_enabled = gc.isenabled()
        gc.collect()  # start from a clean heap: the model build and compilation left garbage
        gc.disable()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (batch_idx + 1) % self.every == 0:
            gc.collect(1)

    def on_train_end(self, trainer, pl_module):
        self._restore()

    def on_exception(self, trainer, pl_module, exception):
        self._restore()

    def _restore(self):
        if self._was_enabled:
            gc.enable()
