"""Lightning callbacks of flux-cp (they import flux_cp; flux_cp never imports them)."""

from callbacks.faults import FaultInjectionCallback
from callbacks.gc_schedule import GcScheduleCallback
from callbacks.guard import GuardCallback
from callbacks.loggers import ResilientWandbLogger
from callbacks.profiler import KernelProfileCallback
from callbacks.progress import StepProgressBar
from callbacks.sigterm import SigtermEveryCallback
from callbacks.syncs import SyncDebugCallback
from callbacks.timing import OpTimingCallback
from callbacks.twin import BareTwinCallback

__all__ = [
    "BareTwinCallback",
    "FaultInjectionCallback",
    "GcScheduleCallback",
    "GuardCallback",
    "KernelProfileCallback",
    "OpTimingCallback",
    "ResilientWandbLogger",
    "SigtermEveryCallback",
    "StepProgressBar",
    "SyncDebugCallback",
]
