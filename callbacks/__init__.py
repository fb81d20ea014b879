"""Lightning callbacks of flux-cp (they import flux_cp; flux_cp never imports them)."""

from callbacks.loggers import ResilientWandbLogger
from callbacks.profiler import KernelProfileCallback
from callbacks.timing import OpTimingCallback

__all__ = ["KernelProfileCallback", "OpTimingCallback", "ResilientWandbLogger"]
