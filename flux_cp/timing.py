"""Named timing regions inside the training step: forward by events around the call, backward by
autograd markers that record an event when the gradient crosses the region's boundaries.

    call = timer.open("sdpa")        # a no-op handle when the timer is off
    q, k, v = call.enter(q, k, v)    # forward start; backward END fires once all their grads exist
    out = attention(q, k, v)
    out = call.exit(out)             # forward end; backward START fires when out's grad arrives

On CUDA every boundary is a CUDA event recorded on the current stream (the autograd engine
runs backward on the forward stream), so a region's figure is the device time between its
boundaries, idle gaps included: under a host-bound step a region stretches to the host's pace.
Nothing synchronises inside the step; `StepTimer.read()` is called once after it. On CPU the
same boundaries are perf_counter readings (ops run synchronously there).
"""

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch


class _Clock:
    """Boundary stamps: CUDA events from a reused pool, or perf_counter seconds on CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._pool: list = []
        self._used = 0

    def reset(self):
        self._used = 0

    def stamp(self):
        if not self.cuda:
            return time.perf_counter()
        if self._used == len(self._pool):
            self._pool.append(torch.cuda.Event(enable_timing=True))
        ev = self._pool[self._used]
        self._used += 1
        ev.record()
        return ev

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


class _Mark(torch.autograd.Function):
    """Identity whose backward stamps a boundary (once all outputs' grads have arrived)."""

    @staticmethod
    def forward(ctx, slot, *xs):
        ctx.slot = slot
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.slot()
        return (None, *grads)


@dataclass
class _Call:
    name: str
    clock: _Clock
    stamps: dict = field(default_factory=dict)  # fwd0, fwd1, bwd0, bwd1

    def _set(self, key):
        def slot():
            self.stamps[key] = self.clock.stamp()

        return slot

    def enter(self, *xs):
        self.stamps["fwd0"] = self.clock.stamp()
        return _mark(self._set("bwd1"), xs)

    def exit(self, *xs):
        self.stamps["fwd1"] = self.clock.stamp()
        return _mark(self._set("bwd0"), xs)


def _mark(slot, xs):
    if not any(x.requires_grad for x in xs):  # no backward to time (e.g. under no_grad)
        return xs
    return _Mark.apply(slot, *xs)


class _NoCall:
    """What open() hands out when the timer is off: enter/exit pass tensors through."""

    @staticmethod
    def enter(*xs):
        return xs

    exit = enter


class StepTimer:
    """Collects the regions of one step, plus the step's own start/end boundaries."""

    def __init__(self, cuda: bool, enabled: bool = True):
        self.clock = _Clock(cuda)
        self.enabled = enabled  # op regions; the step boundaries are always recorded
        self._calls: list[_Call] = []
        self._step: dict = {}

    def open(self, name: str):
        if not self.enabled or not self._step:
            return _NoCall
        call = _Call(name, self.clock)
        self._calls.append(call)
        return call

    def start_step(self):
        self.clock.reset()
        self._calls.clear()
        self._step = {"host0": time.perf_counter(), "dev0": self.clock.stamp()}

    def end_step(self):
        self._step["dev1"] = self.clock.stamp()
        self._step["host1"] = time.perf_counter()

    def read(self) -> dict[str, float]:
        """Synchronise once and turn this step's boundaries into milliseconds.

        Returns `step_ms`, `host_ms`, and per region `<name>_fwd_ms` / `<name>_bwd_ms` (summed over
        calls) with `<name>_fwd_call_ms` / `<name>_bwd_call_ms` (mean per call).
        """
        if self.clock.cuda:
            torch.cuda.current_stream().synchronize()
        s = self._step
        out = {"step_ms": self.clock.ms(s["dev0"], s["dev1"]), "host_ms": (s["host1"] - s["host0"]) * 1e3}
        per: dict[str, list[float]] = defaultdict(list)
        for c in self._calls:
            st = c.stamps
            if "fwd1" in st:
                per[f"{c.name}_fwd"].append(self.clock.ms(st["fwd0"], st["fwd1"]))
            if "bwd0" in st and "bwd1" in st:
                per[f"{c.name}_bwd"].append(self.clock.ms(st["bwd0"], st["bwd1"]))
        for key, vals in per.items():
            out[f"{key}_ms"] = sum(vals)
            out[f"{key}_call_ms"] = sum(vals) / len(vals)
        self._step = {}
        return out
