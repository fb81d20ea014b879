"""Named timing regions inside the training step: forward by events around the call, backward by
autograd markers that record an event when the gradient crosses the region's boundaries.

    call = timer.open("sdpa")        # a no-op handle when the timer is off
    q, k, v = call.enter(q, k, v)    # forward start; backward END fires once all their grads exist
    out = attention(q, k, v)
    out = call.exit(out)             # forward end; backward START fires when out's grad arrives

On CUDA every boundary is a CUDA event recorded on the current stream (the autograd engine
runs backward on the forward stream), so a region's figure is the device time between its
boundaries, idle gaps included: under a host-bound step a region stretches to the host's pace.
Nothing synchronises inside the step, nor between steps: each step keeps its own events until it is
read, `StepTimer.ready(step)` asks (`Event.query()`, no wait) whether its last event has passed, and
only a read after the loop may wait (`read(step, wait=True)`). So the host never waits for the
device for the timer's sake: where the host issues a step about as fast as the device runs it (CP at
W >= 2), any such wait would be step time. On CPU the same boundaries are perf_counter readings (ops
run synchronously there: always ready).

Under `torch` CP the SDPA region is the whole ring: every chunk's kernel, the LSE merges and the
part of the K/V rotation the kernels could not hide. With `annotate` on (profiling), each region
is also a profiler range `flux_cp::<name>_fwd|bwd`, so kernels can be attributed to it.

A "probe" step measures the device's busy time with the host out of the way: a spin kernel
(`torch.cuda._sleep`) holds the stream while the host issues the step, so the step's kernels then
run back to back. Its step time is `device_busy_ms`; `1 - busy / step` is the device idle fraction,
i.e. how host bound the step is; its host time, `host_issue_ms`, is the host's own time to issue a step.
(If the step issues more launches than the driver queues, the host still stalls and busy and host time are
over-estimated: the profiler's figure, `--profile`, checks it; predict/host.py flags a probe whose host time
reached its hold.)
"""

import contextlib
import functools
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.autograd.profiler import record_function

# The idle probe holds the stream ~1.5 host steps so the host can run ahead; with the launch queue CUDA sizes by
# default the host filled it and waited on the device (its issue time an upper bound, the host model not separable:
# H100, W=8, 100.8 ms "issue" in a 44.7 ms step); 4x as deep it did not (44.4 ms), the step itself unchanged (44.7)
LAUNCH_QUEUE = "4x"


def deepen_launch_queue() -> None:
    """CUDA's launch queue 4x as deep for this process and its ranks (a driver setting read at CUDA's start: call
    before any CUDA call; a value the user set is kept, `default` leaves CUDA's own). summary.json `launch_queue`
    reads the environment the run started with."""
    if os.environ.get("CUDA_SCALE_LAUNCH_QUEUES") == "default":
        del os.environ["CUDA_SCALE_LAUNCH_QUEUES"]  # not a value CUDA knows
    else:
        os.environ.setdefault("CUDA_SCALE_LAUNCH_QUEUES", LAUNCH_QUEUE)


@functools.cache
def spin_cycles_per_ms() -> float:
    """Cycles of torch.cuda._sleep per millisecond on this process's GPU, measured once with events."""
    a, b, n = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), 20_000_000
    torch.cuda._sleep(n)  # first call loads the kernel
    a.record()
    torch.cuda._sleep(n)
    b.record()
    b.synchronize()
    return n / a.elapsed_time(b)


def hold_stream(ms: float) -> None:
    """Queue a spin kernel of about `ms` on the current stream: the host runs ahead of the device meanwhile."""
    torch.cuda._sleep(int(ms * spin_cycles_per_ms()))


@contextlib.contextmanager
def sync_allowed(cuda: bool):
    """The instrument's intended wait (a finished step's last event) stays out of the count of
    synchronizing calls that --sync-debug (torch's sync debug mode) makes. A no-op unless that mode is on: setting
    it costs a warning per call."""
    mode = torch.cuda.get_sync_debug_mode() if cuda else 0
    if not mode:
        yield
        return
    torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(mode)


class GcClock:
    """Host time in Python's garbage collector (a gc.callbacks hook): `take()` returns ms since the last take."""

    def __init__(self):
        self._total = 0.0
        self._t0: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self._total += time.perf_counter() - self._t0
            self._t0 = None

    def take(self) -> float:
        ms, self._total = self._total * 1e3, 0.0
        return ms


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
    annotate: bool = False
    stamps: dict = field(default_factory=dict)  # fwd0, fwd1, bwd0, bwd1
    _ranges: dict = field(default_factory=dict)

    def _open(self, key):
        if self.annotate:
            self._ranges[key] = record_function(f"flux_cp::{self.name}_{key}").__enter__()

    def _close(self, key):
        if key in self._ranges:
            self._ranges.pop(key).__exit__(None, None, None)

    def _set(self, key):
        def slot():  # runs in the autograd engine's thread, which opens and closes the bwd range
            if key == "bwd1":
                self.stamps[key] = self.clock.stamp()
                self._close("bwd")
            else:
                self._open("bwd")
                self.stamps[key] = self.clock.stamp()

        return slot

    def enter(self, *xs):
        self._open("fwd")
        self.stamps["fwd0"] = self.clock.stamp()
        return _mark(self._set("bwd1"), xs)

    def exit(self, *xs):
        self.stamps["fwd1"] = self.clock.stamp()
        self._close("fwd")
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


def probe_kind(j: int, every: int) -> str | None:
    """Measured step j (from 0) under an idle probe every `every` steps: "probe" (the device held while the host
    issues it: device_busy_ms, host_issue_ms), "settle" (the step after one, starting on an idle device), or None."""
    if not every or j < 0:
        return None
    if j % every == every - 1:
        return "probe"
    return "settle" if j >= every and j % every == 0 else None


def probe_figures(kind: str, figures: dict) -> dict:
    """A probe's or settle step's figures under their own names, out of the plain steps'. A probe's host time is the
    host's own time to issue a step (the device is held: nothing to wait for), the cost a slower host stretches."""
    if kind == "probe":
        return {"device_busy_ms": figures["step_ms"], "host_issue_ms": figures["host_ms"]}
    return {"step_after_probe_ms": figures["step_ms"]}


def instrumented(j: int, every: int) -> bool:
    """Whether measured step j (from 0) carries the instruments, op regions and the ledger: steps 1, 1 + N, ...
    (step 0 is the step after warm-up; the idle probe's settle steps fall on multiples of 8, never here)."""
    return (j - 1) % every == 0


def timed_names(figures: dict, every: int) -> dict:
    """An instrumented step's own step/host/loop times renamed *_timed_ms, out of the plain steps' (every > 1)."""
    if every <= 1:
        return figures
    return {(f"{k[:-3]}_timed_ms" if k in ("step_ms", "host_ms", "loop_ms") else k): v for k, v in figures.items()}


class StepTimer:
    """Collects the regions of one step, plus the step's own start/end boundaries.

    Any number of steps can be finished and not read yet: each step records on a clock (an event pool) of its own,
    which goes back to the free list once the step is read.
    """

    def __init__(self, cuda: bool, enabled: bool = True, ledger=None):
        self.cuda = cuda
        self.ledger = ledger  # flux_cp.measure.ledger.CommLedger: the step's collectives, on the step's clock
        self._free: list[_Clock] = []  # clocks of steps already read
        self.clock = _Clock(cuda)
        self.waits = 0  # reads that had to wait for the device (read(step, wait=True) of a step not yet done)
        self.enabled = enabled  # op regions; the step boundaries are always recorded
        self.annotate = False  # profiler ranges around the regions (set while profiling)
        self._regions_on = False  # this step's regions
        self._comm_on = False  # this step's collectives recorded (a ledger, and the step asked for it)
        self._calls: list[_Call] = []
        self._step: dict = {}

    def open(self, name: str):
        # a forward recomputed inside the backward (activation checkpointing): not the forward's region again
        if not self._regions_on or torch._C._current_graph_task_id() != -1:
            return _NoCall
        call = _Call(name, self.clock, self.annotate)
        self._calls.append(call)
        return call

    def start_step(self, regions: bool = True, probe_ms: float = 0.0, comm: bool = True) -> float:
        """Open a step; returns its start on the host clock (perf_counter). regions: time the op regions in it. comm:
        the ledger (if any) records its collectives. probe_ms > 0 (CUDA): hold the stream that long before the step's
        first boundary, so the host runs ahead and the step shows busy time."""
        self.clock = self._free.pop() if self._free else _Clock(self.cuda)
        self.clock.reset()
        self._calls = []
        self._regions_on = self.enabled and regions
        host0 = time.perf_counter()
        if probe_ms > 0 and self.cuda:
            hold_stream(probe_ms)
        self._step = {"host0": host0, "dev0": self.clock.stamp(), "phases": {}}
        self._comm_on = self.ledger is not None and comm
        if self._comm_on:
            self.ledger.start(self.clock)
        return host0

    def mark(self, phase: str) -> None:
        """A phase boundary of the step (forward_end, backward_end): where asynchronous collectives are consumed."""
        if not self._step:
            return
        if self.cuda and torch.cuda.is_current_stream_capturing():  # --step-graph: an event the replays record
            if self.ledger is not None:
                self.ledger.graph_mark(phase)
            return
        self._step["phases"][phase] = self.clock.stamp()

    def end_step(self, loss: torch.Tensor | None = None) -> dict:
        """Close the step; its figures come from read(step), which may wait until a later step is issued.
        loss: handed to the host with the step (step["loss"]). On CUDA it is copied asynchronously to pinned
        memory right after the step's last boundary: a D2H copy is stream-ordered, so a later `.item()` on the
        device tensor would wait for every kernel issued since, draining the device at every step."""
        step = self._step | {"dev1": self.clock.stamp(), "calls": self._calls, "clock": self.clock}
        if self._comm_on:
            step["graph_phases"] = self.ledger.graph_phases  # a replayed step graph's phase marks
            step["comm"] = self.ledger.stop()
        if loss is not None:
            step["loss"] = loss.detach()
            if self.cuda:
                step["loss"] = step["loss"].to("cpu", non_blocking=True)
                step["ready"] = self.clock.stamp()  # the copy has landed once this event has
        step["host1"] = time.perf_counter()
        self._step, self._calls, self._regions_on, self._comm_on = {}, [], False, False
        return step

    def ready(self, step: dict) -> bool:
        """Whether the step's last event has passed (never waits)."""
        return not self.cuda or step.get("ready", step["dev1"]).query()

    def read(self, step: dict, wait: bool = False) -> dict[str, float]:
        """The step's boundaries in milliseconds. Only with wait=True may it wait for the step's last event (after
        the loop); inside it, read only steps that are ready(). Its clock is then free for a later step.

        Returns `step_ms`, `host_ms`, `loss` (when end_step was given one), and per region `<name>_fwd_ms` /
        `<name>_bwd_ms` (summed over calls) with `<name>_fwd_call_ms` / `<name>_bwd_call_ms` (mean per call);
        with a ledger, `comm`: the step's collectives and phase ends in ms from its start (not a figure).
        """
        if not self.ready(step):
            if not wait:
                raise RuntimeError("StepTimer.read: the step's events have not all passed (check ready(), or wait)")
            self.waits += 1
            step.get("ready", step["dev1"]).synchronize()  # callers wait under sync_allowed
        clock = step["clock"]
        ms = clock.ms
        out = {"step_ms": ms(step["dev0"], step["dev1"]), "host_ms": (step["host1"] - step["host0"]) * 1e3}
        if "loss" in step:
            out["loss"] = step["loss"].item()  # a host tensor by now: no wait
        if "comm" in step:
            from flux_cp.measure.ledger import graph_phases, resolve

            phases = {f"{k}_ms": round(ms(step["dev0"], v), 4) for k, v in step["phases"].items()}
            ends = (step["dev0"], step["dev1"])
            out["comm"] = {"phases": phases | graph_phases(step.get("graph_phases", []), ms, *ends),
                           "collectives": resolve(step["comm"], ms, *ends)}
        per: dict[str, list[float]] = defaultdict(list)
        for c in step["calls"]:
            st = c.stamps
            if "fwd1" in st:
                per[f"{c.name}_fwd"].append(ms(st["fwd0"], st["fwd1"]))
            if "bwd0" in st and "bwd1" in st:
                per[f"{c.name}_bwd"].append(ms(st["bwd0"], st["bwd1"]))
        for key, vals in per.items():
            out[f"{key}_ms"] = sum(vals)
            out[f"{key}_call_ms"] = sum(vals) / len(vals)
        if clock is not self.clock or not self._step:  # a running step's clock stays its own
            self._free.append(clock)
        return out
