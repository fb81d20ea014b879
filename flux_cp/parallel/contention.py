"""--contention: a simulated rank's communication put on its GPU while the rank computes.

A simulated rank (parallel/fake_group.py) issues its collectives to torch's fake group: they move nothing, and its
compute has the GPU to itself, where a real rank's overlapped compute shares SMs and HBM with NCCL's kernels (arXiv
2507.03114: overlapped compute 18.9% slower on average, up to 40%). With --contention each collective the rank
issues launches, on a communication stream of its own, a kernel of --contention-ctas CTAs (NCCL's channels, one CTA
each) that stays resident for the collective's priced time (LINK: latency + bus bytes / bus bandwidth, as
predict/step_model.py prices it) while reading and writing its bus bytes in scratch buffers of its own, paced over
that time (the device's globaltimer): the SM share and the local HBM traffic of the rank's NCCL kernel (what it
sends is read, what it receives is written), beside the compute a real rank runs meanwhile.

    traffic = start(run, device)    # FluxStep: the ledger's dispatcher kernels tap every collective from now on
    traffic.summary()               # summary.json "contention": kernels, bus bytes, priced ms, what was left out
    stop()                          # FluxStep.close: no more taps

It changes no number of the step (the kernel touches only its scratch) and the step never waits for it (no event of
it is read, no sync): the communication stream waits for the issuing stream on the device, so the traffic starts
where its collective is issued, and runs in issue order, as NCCL's collectives on one stream do.
Left out: blocking collectives (c10d's async_op=False: plain Ulysses' all-to-alls, allgather-kv's gathers), which a
real rank's compute waits through with nothing beside them; and recv (a ring step's send and recv are one NCCL
kernel: the send carries it, as step_model prices them). Functional collectives are taken as overlapped: where their
consumer waits at once (the ring's all-gather rotation) the contention is overstated. Traffic past the step's
compute (exposed communication) runs on under the next step's. Inside a CUDA graph (--step-graph, reduce-overhead)
the traffic is captured with the step and replays with it; the communication stream joins the capture back at its
end, as a capture requires, so a replayed step ends with its traffic.
Host cost: every collective pays the ledger's Python call and the kernel's launch, in every step (eager).
"""

import math
import weakref
from dataclasses import dataclass

import torch

from flux_cp.measure.ledger import CommLedger
from flux_cp.predict.links import LinkProfile, bus_factor, load

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs: --contention is refused there (checks.py)
    triton = None

LINK = "h200-nvlink4"  # the profile the traffic is sized with (the report's default)
BLOCK = 4096  # 4-byte words a CTA moves per iteration: 16 KiB
WORD = 4
WARPS = 16  # 512 threads a CTA, as NCCL's (NCCL_NTHREADS 512)
SCRATCH_BYTES = 64 * 2**20  # source and destination each: past the 50 MB L2 of an H100/H200, so traffic reaches HBM


@dataclass(frozen=True)
class Traffic:
    """One collective's kernel: every CTA runs `iters` iterations of BLOCK words (the last iteration's first
    `last_words` words across the CTAs), one every `pace_ns`, so that it lasts `duration_ns`."""

    bus_bytes: int
    duration_ns: int
    iters: int
    last_words: int
    pace_ns: int


def plan(kind: str, nbytes: int, group_size: int, async_op: bool, link: LinkProfile, ctas: int) -> Traffic | None:
    """The traffic of one collective of nccl-tests size nbytes over group_size ranks, or None where none runs beside
    the compute (one rank, a blocking collective, a recv)."""
    if group_size <= 1 or kind == "recv" or not async_op:
        return None
    return sized(int(nbytes * bus_factor(kind, group_size)), round(link.price_ms(kind, nbytes, group_size) * 1e6), ctas)


def sized(bus_bytes: int, duration_ns: int, ctas: int) -> Traffic:
    """A kernel of `ctas` CTAs moving bus_bytes (at least one word) paced over duration_ns (0: as fast as it can)."""
    words = max(1, math.ceil(bus_bytes / WORD))
    per_iter = ctas * BLOCK
    iters = math.ceil(words / per_iter)
    return Traffic(bus_bytes, duration_ns, iters, words - (iters - 1) * per_iter, duration_ns // iters)


if triton is not None:

    @triton.jit
    def _now():
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)

    # sizes vary per collective: no recompilation by value (a CUDA graph's capture cannot compile)
    @triton.jit(do_not_specialize=["iters", "span_iters", "last_words", "pace_ns"])
    def _traffic(src, dst, iters, span_iters, last_words, pace_ns, BLOCK: tl.constexpr):
        pid, ctas = tl.program_id(0), tl.num_programs(0)
        lane = pid * BLOCK + tl.arange(0, BLOCK)
        t0 = _now()
        for i in range(iters):
            offs = (i % span_iters) * ctas * BLOCK + lane  # the scratch is span_iters iterations long, reused
            mask = (i < iters - 1) | (lane < last_words)
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
            deadline = t0 + (i + 1).to(tl.int64) * pace_ns  # paced: the bytes spread over the priced time
            t = _now()
            while t < deadline:
                t = _now()


def scratch(device: torch.device, ctas: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(source, destination, iterations they hold): the traffic's own buffers, ~SCRATCH_BYTES each."""
    span_iters = max(1, SCRATCH_BYTES // WORD // (ctas * BLOCK))
    src = torch.zeros(span_iters * ctas * BLOCK, dtype=torch.int32, device=device)
    return src, torch.empty_like(src), span_iters


def launch(t: Traffic, ctas: int, src: torch.Tensor, dst: torch.Tensor, span_iters: int) -> None:
    """t's kernel on the current stream (no wait, no sync)."""
    _traffic[(ctas,)](src, dst, t.iters, span_iters, t.last_words, t.pace_ns, BLOCK=BLOCK, num_warps=WARPS)


class Contention:
    """The process's traffic (one: a Lightning run's bare twin shares it)."""

    def __init__(self, run, device: torch.device, link: LinkProfile):
        if triton is None:
            raise RuntimeError("--contention: its traffic kernel needs Triton (pip install triton)")
        self.run, self.ctas, self.link = run, run.contention_ctas, link
        ctas = self.ctas
        self.stream = torch.cuda.Stream(device)
        self.src, self.dst, self.span_iters = scratch(device, ctas)
        for t in (self.src, self.dst):  # freed at the run's end: not reused before the traffic in flight ends
            t.record_stream(self.stream)
        self.counts = self._zero()
        self.left_out = {"blocking": 0, "recv": 0, "one_rank": 0}
        self._pending = None  # counts of the capture the stream has joined, until it ends
        self._graphs = weakref.WeakKeyDictionary()  # CUDAGraph -> the counts it captured (added at each replay)
        self._launch(plan("all_reduce", WORD, 2, True, link, ctas))  # compiled now: never inside a capture
        torch.cuda.synchronize(device)
        self.counts = self._zero()

    @staticmethod
    def _zero() -> dict:
        return {"kernels": 0, "bus_bytes": 0, "priced_ms": 0.0, "replayed": 0}

    def _launch(self, t: Traffic) -> None:
        launch(t, self.ctas, self.src, self.dst, self.span_iters)

    def issued(self, kind: str, nbytes: int, group_size: int, async_op: bool) -> None:
        """The ledger's tap: a collective issued on the current stream."""
        t = plan(kind, nbytes, group_size, async_op, self.link, self.ctas)
        if t is None:
            self.left_out["one_rank" if group_size <= 1 else "recv" if kind == "recv" else "blocking"] += 1
            return
        self.stream.wait_stream(torch.cuda.current_stream())  # from the collective's place on; capturing: a fork
        with torch.cuda.stream(self.stream):
            self._launch(t)
        if torch.cuda.is_current_stream_capturing():
            self._pending = self._pending or self._zero()
            _add(self._pending, t)
        else:
            _add(self.counts, t)

    def capture_ends(self, graph) -> None:
        """Before a capture ends: the communication stream joins it back (as a capture must); its traffic is the
        graph's."""
        if self._pending is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
            self._graphs[graph], self._pending = self._pending, None

    def replayed(self, graph) -> None:
        if (c := self._graphs.get(graph)) is not None:
            for k in ("kernels", "bus_bytes", "priced_ms"):
                self.counts[k] += c[k]
            self.counts["replayed"] += c["kernels"]

    def summary(self) -> dict:
        """summary.json's "contention": what this process put on the device (host counts, no device read)."""
        return {"on": True, "ctas": self.ctas, "link": self.link.name, "warps_per_cta": WARPS,
                **self.counts, "priced_ms": round(self.counts["priced_ms"], 4), "left_out": dict(self.left_out)}


def _add(counts: dict, t: Traffic) -> None:
    counts["kernels"] += 1
    counts["bus_bytes"] += t.bus_bytes
    counts["priced_ms"] += t.duration_ns / 1e6


_current: Contention | None = None


def start(run, device: torch.device) -> Contention:
    """The run's traffic (made at its first call: its bare twin's steps share it), tapping every collective."""
    global _current
    if _current is not None and _current.run is not run:  # an earlier run's, left by its failure (in-process sweeps)
        stop()
    if _current is None:
        _current = Contention(run, device, load(LINK))
        _watch_graphs()
        CommLedger.get().tap(_current.issued)
    return _current


def stop() -> None:
    """No more traffic (a run's end: an in-process sweep's next run may have none)."""
    global _current
    if _current is not None:
        CommLedger.get().tap(None)
        _current = None


_watching = False


def _watch_graphs() -> None:
    """torch.cuda.CUDAGraph's capture_end and replay, wrapped once per process (as the ledger's): the communication
    stream joins a capture back before it ends, and a replay's traffic is counted."""
    global _watching
    if _watching:
        return
    _watching = True
    cls = torch.cuda.CUDAGraph
    end, replay = cls.capture_end, cls.replay

    def capture_end(graph):
        if _current is not None:
            _current.capture_ends(graph)
        return end(graph)

    def replay_(graph):
        if _current is not None:
            _current.replayed(graph)
        return replay(graph)

    cls.capture_end, cls.replay = capture_end, replay_
