"""SigtermEveryCallback (--sigterm-every N): Lightning's per-step SIGTERM check, every N steps.

Lightning 2.6 (its PR 20825) broadcasts a SIGTERM flag from rank 0 and reads it back (`.item()`) before every
training step when the world size is > 1, so that all ranks stop together after a SIGTERM. On CUDA that read
waits until the device has run every kernel issued so far: the device's queue drains at each step start, and
where the host issues a step about as fast as the device runs it (CP at W >= 2) the whole prologue of the next
step becomes idle device time (measured on an H200: 20% of the loop's host time). Here the check runs every N
steps, as Lightning's open PR 21640 proposes; N = 1 is stock Lightning, so the report can say what it costs.
A SIGTERM still ends the run at once on every rank: callbacks/guard.py turns it into an exception.
summary.json's `sigterm_checks` says how many steps asked and how many broadcasts were made.
"""

from lightning.pytorch import Callback


class SigtermEveryCallback(Callback):
    def __init__(self, every: int, header: dict):
        self.every = every
        self.header = header  # the run summary's header (the timing callback writes it)
        self.steps = 0  # checks Lightning asked for (one per step at world size > 1)
        self.broadcasts = 0  # checks made

    def setup(self, trainer, pl_module, stage):
        loop = trainer.fit_loop.epoch_loop
        original = getattr(loop, "_broadcast_sigterm_tensor", None)
        if original is None:  # a Lightning before PR 20825: no per-step check to thin out
            return

        def check():
            self.steps += 1
            if (self.steps - 1) % self.every == 0:
                self.broadcasts += 1
                original()
            self.header["sigterm_checks"] = {"every": self.every, "steps": self.steps, "broadcasts": self.broadcasts}

        loop._broadcast_sigterm_tensor = check  # this trainer's loop only: an instance attribute
