"""Lightning callbacks of flux-cp (they import flux_cp; flux_cp never imports them)."""

from callbacks.timing import OpTimingCallback

__all__ = ["OpTimingCallback"]
