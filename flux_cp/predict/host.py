"""The step as a function of the host's speed (issue 40): a two-resource model, fitted on one run's measured step.

A step is issued by the host and run by the device. The run's idle probes (flux_cp/measure/timing.py) measure both
alone: D, the device's busy time (`device_busy_ms`: the host ran ahead), and H, the host's own time to issue the step
(`host_issue_ms`: the device was held, nothing to wait for). A host h times slower (its probe's microseconds per tiny
op over the fitted run's: summary.json host_speed) takes H*h; the device's D does not change. The step follows the
slower of the two, plus what the measured step S held beyond it (r: syncs, the queue's start, imperfect overlap):

    step(h) = max(D, H * h) + r,    r = S - max(D, H)        (so step(1) = S)

A simulated rank's projected step adds its exposed communication as priced at h = 1 (the link does not depend on the
host). Faster hosts (h < 1) come from the same formula: the step falls to D + r and no further. Stated assumptions:
host and device overlap fully (one queue, no sync inside the step but what r holds), and r and D do not depend on
the host. The report (flux_cp/report/host_axis.py) fits it on the runs of a host as it is and checks it on runs of
an emulated slower host (--host-slowdown), with its error there.
"""

import statistics
from dataclasses import dataclass

STALL = 0.95  # a probe whose host time reaches this share of its hold: the host waited for the device in it


def host_us(d: dict) -> float | None:
    """The run's host speed, microseconds per tiny op: the mean of its probes before and after the steps (each the
    mean over its reps: a share of a core shows over tens of ms, not in a rep's few), else their medians; None for a
    summary without a probe."""
    hs = d.get("host_speed") or {}
    probes = [p for p in (hs.get("before") or (d.get("env") or {}).get("host_probe"), hs.get("after")) if p]
    vals = [p.get("mean_us", p.get("median_us")) for p in probes]
    if not any(v is not None for v in vals):  # summaries before host_speed: env.host_op_us, host_op_us_end
        vals = [(d.get("env") or {}).get("host_op_us"), d.get("host_op_us_end")]
    vals = [v for v in vals if v]
    return statistics.fmean(vals) if vals else None


@dataclass
class HostModel:
    step_ms: float  # S: the measured step at the fitted run's host
    device_busy_ms: float  # D
    host_issue_ms: float  # H
    host_us: float | None  # the fitted run's host speed (None: not recorded)
    extra_ms: float = 0.0  # exposed communication a simulated rank's projected step adds
    stalled: bool = False  # the probe's host waited for the device: D and H are upper bounds

    @property
    def residual_ms(self) -> float:
        return self.step_ms - max(self.device_busy_ms, self.host_issue_ms)

    @property
    def host_bound_share(self) -> float:
        """The step's share the device sits idle waiting on the host, at the fitted run's host."""
        return max(0.0, 1.0 - self.device_busy_ms / self.step_ms)

    @property
    def host_paced_above(self) -> float:
        """The slowdown from which the host sets the pace (H*h > D), relative to the fitted run's host."""
        return self.device_busy_ms / self.host_issue_ms

    def step_at(self, h: float) -> float:
        """The step on a host h times slower than the fitted run's (h < 1: faster)."""
        return max(self.device_busy_ms, self.host_issue_ms * h) + self.residual_ms

    def projected_at(self, h: float) -> float:
        return self.step_at(h) + self.extra_ms

    def h_of(self, us: float | None, nominal: float = 1.0) -> float:
        """A host of `us` microseconds per op as a slowdown of the fitted run's; without either speed, `nominal`."""
        return us / self.host_us if us and self.host_us else nominal

    def to_dict(self) -> dict:
        return {"step_ms": self.step_ms, "device_busy_ms": self.device_busy_ms, "host_issue_ms": self.host_issue_ms,
                "residual_ms": self.residual_ms, "host_us": self.host_us, "extra_ms": self.extra_ms,
                "host_bound_share": self.host_bound_share, "host_paced_above": self.host_paced_above,
                "stalled": self.stalled}


def _median(d: dict, name: str) -> float | None:
    m = (d.get("metrics") or {}).get(name)
    return m.get("median") if isinstance(m, dict) else None


def fit(d: dict, extra_ms: float = 0.0) -> tuple[HostModel | None, str | None]:
    """(the model of a run's summary, None) or (None, why not)."""
    step, busy, issue = (_median(d, k) for k in ("step_ms", "device_busy_ms", "host_issue_ms"))
    if not step:
        return None, "no step time"
    if busy is None or not issue:
        return None, ("no idle probe: device busy and host issue time not recorded (a CUDA run with "
                      "--idle-probe-every > 0 records both)")
    holds = d.get("probe_hold_ms") or []
    stalled = bool(holds) and issue >= STALL * statistics.median(holds)
    if stalled and issue > step:  # H holds waits on the device: r = S - H < 0 and max(D, H h) + r means nothing
        return None, (f"host issue {issue:.3g} ms over a {step:.3g} ms step: the idle probe's host waited on the "
                      "device, its own time is not separable (only measured hosts count)")
    return HostModel(step, busy, issue, host_us(d), extra_ms, stalled), None


def speedups_at(base: HostModel, cells: dict[int, HostModel], h: float, ref_us: float | None = None
                ) -> dict[int, float]:
    """{W: speedup} on a host h times slower than the reference host, `ref_us` us/op (default: the baseline run's),
    each run's own host placed on that axis by its probe."""
    ref_us = ref_us or base.host_us
    us = ref_us * h if ref_us else None
    return {W: base.projected_at(base.h_of(us, h)) / m.projected_at(m.h_of(us, h)) for W, m in cells.items()}


def ranges(hs: list[float], ok: list[bool]) -> list[tuple[float, float]]:
    """The runs of consecutive True in ok, as (first h, last h)."""
    out: list[tuple[float, float]] = []
    for i, (h, good) in enumerate(zip(hs, ok)):
        if good and (i == 0 or not ok[i - 1]):
            out.append((h, h))
        elif good:
            out[-1] = (out[-1][0], h)
    return out
