"""Predict a W-rank step from one rank's compute timeline and its communication ledger (pure functions).

    prof = links.load("configs/links/h200-nvlink4.yaml")
    tl, colls = timeline_from_record(summary["comm"]["ledger"][i])      # or approximate_ledger(summary, W)
    p = predict(tl, colls, prof)       # p.predicted_ms, p.lower_ms, p.upper_ms, p.exposed_ms_by_kind

The model (sequential, as a GPU runs it): one communication stream runs the collectives in issue order,
each starting when it is issued (its position on the compute timeline, shifted by the delays so far) or
when the stream is free, whichever is later, and lasting its price (latency + bus bytes / bus bandwidth).
A blocking collective (Ulysses' all-to-all, allgather-kv's gathers) stops the compute until it ends;
an asynchronous one (DDP's bucket all-reduce, the ring's next-chunk rotation, ZeRO's broadcasts) delays
the compute only where its consumer waits, by whatever is left of it then. What the compute waits for is
the exposed communication; it is charged to the collectives the stream was running meanwhile.
Bounds: everything hidden (lower = compute) and nothing hidden (upper = compute + every price).
It ignores that communication kernels slow concurrent compute (shared SMs, memory bandwidth): on GPUs
the measured step can exceed the prediction by that; the real-process check says by how much, and a simulated rank
run with --contention (parallel/contention.py) computes beside its collectives' traffic, so its timeline carries it.
"""

from dataclasses import dataclass, field

from flux_cp.config import run_setting
from flux_cp.predict.links import LinkProfile

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv")


@dataclass
class Timeline:
    """One rank's step with collectives that take no time (a simulated rank, or the compute of a real one)."""

    step_ms: float
    forward_end_ms: float | None = None
    backward_end_ms: float | None = None

    def phase_end(self, t: float) -> float:
        """Where an unknown consumer waits: the end of the phase the collective was issued in."""
        for end in (self.forward_end_ms, self.backward_end_ms):
            if end is not None and t <= end:
                return end
        return self.step_ms


@dataclass
class Collective:
    kind: str
    bytes: float  # nccl-tests' "size" (links.bus_factor turns it into bus bytes)
    group_size: int
    issue_ms: float
    is_async: bool = False
    wait_ms: float | None = None  # None: the end of the phase it was issued in
    stream: str = "compute"

    @classmethod
    def from_dict(cls, d: dict) -> "Collective":
        return cls(d["kind"], float(d["bytes"]), int(d["group_size"]), float(d["issue_ms"]), bool(d.get("async")),
                   None if d.get("wait_ms") is None else float(d["wait_ms"]), d.get("stream", "compute"))


@dataclass
class Prediction:
    predicted_ms: float
    lower_ms: float  # everything overlapped: compute only
    upper_ms: float  # nothing overlapped: compute + the sum of prices
    comm_ms: float  # the sum of prices
    exposed_ms_by_kind: dict[str, float] = field(default_factory=dict)
    priced_ms_by_kind: dict[str, float] = field(default_factory=dict)

    @property
    def exposed_ms(self) -> float:
        return sum(self.exposed_ms_by_kind.values())


def predict(tl: Timeline, colls: list[Collective], link: LinkProfile) -> Prediction:
    """The step of a W-rank job: compute timeline + the communication the compute has to wait for."""
    # events on the compute timeline: issues (0) before waits (1) at the same position, so that a collective
    # awaited where it is issued behaves as a blocking one
    events = []
    for i, c in enumerate(colls):
        wait = c.issue_ms if not c.is_async else (tl.phase_end(c.issue_ms) if c.wait_ms is None else c.wait_ms)
        events += [(c.issue_ms, 0, i), (max(c.issue_ms, min(wait, tl.step_ms)), 1, i)]
    events.sort()
    prices = [link.price_ms(c.kind, c.bytes, c.group_size) for c in colls]
    shift, free = 0.0, 0.0  # compute delay so far; when the comm stream is free
    busy: list[tuple[float, float, str]] = []  # (start, end, kind) on the comm stream
    ends = [0.0] * len(colls)
    exposed = dict.fromkeys(sorted({c.kind for c in colls}), 0.0)
    for pos, what, i in events:
        now = pos + shift
        if what == 0:
            start = max(now, free)
            ends[i] = free = start + prices[i]
            busy.append((start, free, colls[i].kind))
        if what == 1 and ends[i] > now:  # the consumer waits: the stall goes to whatever the stream runs then
            for s, e, kind in busy:
                exposed[kind] += max(0.0, min(e, ends[i]) - max(s, now))
            shift += ends[i] - now
    priced = dict.fromkeys(exposed, 0.0)
    for c, p in zip(colls, prices):
        priced[c.kind] += p
    total = sum(prices)
    return Prediction(tl.step_ms + shift, tl.step_ms, tl.step_ms + total, total, exposed, priced)


def timeline_from_record(rec: dict, fsdp_ahead: int = 1) -> tuple[Timeline, list[Collective]]:
    """One ledger record of summary.json's comm.ledger (see docs/design.md) -> the timeline and its collectives.
    fsdp_ahead: how many units ahead FSDP2 gathers (fsdp_ahead(summary))."""
    ph = rec.get("phases") or {}
    tl = Timeline(float(rec["step_ms"]), ph.get("forward_end_ms", ph.get("forward_end")),
                  ph.get("backward_end_ms", ph.get("backward_end")))
    # issue_ms None: stamped inside a CUDA graph capture (no event possible); placed at the step's start
    colls = [Collective.from_dict({**c, "issue_ms": c.get("issue_ms") or 0.0}) for c in rec["collectives"]]
    # a ring step's send and recv run at once in opposite directions: the send carries the price
    sends = {(c.bytes, c.issue_ms) for c in colls if c.kind == "send"}
    return tl, place_fsdp([c for c in colls if not (c.kind == "recv" and (c.bytes, c.issue_ms) in sends)], tl,
                          fsdp_ahead)


def fsdp_ahead(d: dict) -> int:
    """Units ahead a run's FSDP2 issues its all-gathers: --fsdp-prefetch N, else FSDP2's own one."""
    return max(1, int(run_setting(d["config"]["run"], "fsdp_prefetch")))


def place_fsdp(colls: list[Collective], tl: Timeline, ahead: int = 1) -> list[Collective]:
    """FSDP2's all-gathers and reduce-scatters, where the compute waits for them. FSDP2 issues them synchronously
    on its own streams (the ledger: stream side, async false) and makes the compute stream wait on an event: a
    unit's all-gather is issued `ahead` units ahead (its forward: when the unit before starts; its backward: when the
    unit after starts its backward; --fsdp-prefetch N: N ahead, one new gather a unit) and waited for where the unit
    starts, which is where the gather `ahead` places later is issued; a reduce-scatter, at the end of the backward.
    Priced as blocking they would charge the step every byte FSDP hides."""
    fsdp = [c.stream == "side" and not c.is_async and c.wait_ms is None and c.kind in ("all_gather", "reduce_scatter")
            for c in colls]
    gathers = [i for i, c in enumerate(colls) if fsdp[i] and c.kind == "all_gather"]  # in issue order
    unit_start = {i: colls[gathers[k + ahead]].issue_ms for k, i in enumerate(gathers) if k + ahead < len(gathers)}
    out = list(colls)
    for i, c in enumerate(colls):
        if fsdp[i]:  # waited for where its unit starts, within its phase; a reduce-scatter at the phase's end
            wait = min(max(unit_start.get(i, float("inf")), c.issue_ms), tl.phase_end(c.issue_ms))
            out[i] = Collective(c.kind, c.bytes, c.group_size, c.issue_ms, True, wait, c.stream)
    return out


def predict_ledger(ledger: list[dict], link: LinkProfile, step_ms: float | None = None,
                   fsdp_ahead: int = 1) -> Prediction:
    """The median step over the ledger's records (each predicted on its own timeline).

    step_ms: rescale every record's timeline to this step (e.g. the run's median step_ms), so that the
    prediction uses the same compute as the report's other figures; None keeps each record's own."""
    preds = []
    # a probe step's step_ms is busy time; the step after it starts on an idle device
    for rec in [r for r in ledger if r.get("kind") not in ("probe", "settle")] or ledger:
        tl, colls = timeline_from_record(rec, fsdp_ahead)
        if step_ms is not None and tl.step_ms > 0:
            tl, colls = _scaled(tl, colls, step_ms / tl.step_ms)
        preds.append(predict(tl, colls, link))
    preds.sort(key=lambda p: p.predicted_ms)
    return preds[(len(preds) - 1) // 2] if preds else None  # a real record, not an average of records


def _scaled(tl: Timeline, colls: list[Collective], k: float) -> tuple[Timeline, list[Collective]]:
    s = lambda x: None if x is None else x * k  # noqa: E731
    out = [Collective(c.kind, c.bytes, c.group_size, c.issue_ms * k, c.is_async, s(c.wait_ms), c.stream)
           for c in colls]
    return Timeline(tl.step_ms * k, s(tl.forward_end_ms), s(tl.backward_end_ms)), out


# ---------------------------------------------------------------- a ledger from byte counts (no comm.ledger)

DTYPE_BYTES = {"bf16-true": 2, "16-true": 2, "bf16-mixed": 2, "16-mixed": 2, "32-true": 4, "64-true": 8}
DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb
FIRST_BUCKET_BYTES = 2**20  # DDP's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)


def approximate_ledger(d: dict, W: int, optimizer_ms: float | None = None, step_ms: float | None = None,
                       zero: bool | None = None) -> tuple[Timeline, list[Collective]]:
    """The collectives a W-rank step of summary d issues, from its shapes, placed on an assumed timeline.

    Phases: the optimizer last (its profiled time, else 10% of the step), backward 2/3 of the rest.
    Blocks spread evenly over forward and backward; per block and direction, as the strategies run them:
      allgather-kv: one all-gather of K and V (blocking); backward reduce-scatters dK, dV (blocking);
      ulysses: q, k, v in (one all-to-all of the three, or one each: ulysses_qkv) and the output back, of the
        local (B, H, S/W, D) each, blocking, each direction (ulysses_overlap's too: an upper bound for it);
      torch ring, allgather rotation: all-gather K, V (blocking) each direction; backward rotates dK, dV
        around the ring (W-1 sends of the local chunk, asynchronous, each consumed one chunk later);
      torch ring, alltoall rotation: the K, V chunks move by W-1 sends as well, overlapped the same way;
      tp: the sequence all-gathered and reduce-scattered (blocking) once a single block, twice a double block
        (attention and FF; its two streams together the sequence), each direction.
    Gradients (tp: every parameter counted, an upper bound): DDP all-reduces buckets (1 MiB first, then 25 MiB) as
    the backward produces them (async, consumed at its end);
    ZeRO-1 (weights zero) then broadcasts each rank's updated share (async, consumed at the step's end).
    """
    cfg = d["config"]
    m, data, run = cfg["model"], cfg["data"], cfg["run"]
    b = DTYPE_BYTES.get(run["precision"], 4)
    B, H, D = data["batch_size"], m["num_heads"], m["head_dim"]
    S = data["image_height"] * data["image_width"] + data["text_tokens"]
    blocks = int(m.get("double_blocks", 0)) + int(m.get("single_blocks", 0))
    bhsd = B * H * S * D * b  # one full K (or V) in bytes
    step = float(step_ms if step_ms is not None else d["metrics"]["step_ms"]["median"])
    opt = optimizer_ms if optimizer_ms is not None else ((d.get("profile") or {}).get("breakdown_ms") or {}).get(
        "optimizer", 0.1 * step)
    opt = min(opt, 0.5 * step)
    bwd_end = step - opt
    fwd_end = bwd_end / 3
    tl = Timeline(step, fwd_end, bwd_end)
    colls: list[Collective] = []
    cp = d["cp"]
    rotate = run.get("rotate", "allgather")
    if W > 1 and cp != "none":
        for phase, (t0, t1) in (("fwd", (0.0, fwd_end)), ("bwd", (fwd_end, bwd_end))):
            dt = (t1 - t0) / blocks
            for k in range(blocks):
                t, t_end = t0 + k * dt, t0 + (k + 1) * dt
                if cp == "allgather-kv":  # K and V in one buffer
                    colls.append(Collective("all_gather" if phase == "fwd" else "reduce_scatter", 2 * bhsd, W, t))
                elif cp == "tp":  # double blocks first (forward order; the backward's reverse reads alike)
                    n = 2 if (k if phase == "fwd" else blocks - 1 - k) < int(m.get("double_blocks", 0)) else 1
                    colls += [Collective("all_gather", bhsd, W, t),
                              Collective("reduce_scatter", bhsd, W, t + 0.5 * dt)] * n
                elif cp == "ulysses":
                    qkv = ([Collective("all_to_all", 3 * bhsd / W, W, t)] if run_setting(run, "ulysses_qkv")
                           == "fused" else [Collective("all_to_all", bhsd / W, W, t)] * 3)
                    colls += qkv + [Collective("all_to_all", bhsd / W, W, t + 0.5 * dt)]
                else:  # torch ring
                    sends = (W - 1) * (phase == "bwd")  # dK, dV go around the ring in backward
                    if rotate == "allgather":
                        colls += [Collective("all_gather", bhsd, W, t)] * 2
                    else:
                        sends += W - 1  # the K, V chunks themselves
                    chunk_dt = dt / W  # one chunk's attention: the next chunk's transfer hides behind it
                    for j in range(sends):
                        ti = t + (j % (W - 1)) * chunk_dt
                        colls.append(Collective("send", 2 * bhsd / W, W, ti, True, min(ti + chunk_dt, t_end)))
    params = d.get("params")
    if W > 1 and isinstance(params, (int, float)) and params > 0:
        grad = params * b
        sizes = [min(grad, FIRST_BUCKET_BYTES)]
        while sum(sizes) < grad:
            sizes.append(min(DDP_BUCKET_BYTES, grad - sum(sizes)))
        done = 0.0
        for size in sizes:  # buckets fill from the last layer's gradients to the first's, as the backward runs
            done += size
            colls.append(Collective("all_reduce", size, W, fwd_end + done / grad * (bwd_end - fwd_end), True))
        if zero if zero is not None else d.get("weights") == "zero":
            colls += [Collective("broadcast", grad / W, W, step, True, step) for _ in range(W)]
    return tl, colls
