"""The host as an axis (issue 40): each regime's speedups as a function of the host's speed.

At W >= 2 the user's step is host bound at batch 1, so a speedup holds for one host. Every run's host probe
(summary.json host_speed) places it on a host-speed axis, and its idle probes give predict/host.py's model of its
step: step(h) = max(D, H*h) + r (D: device busy, H: the host's own issue time, r: the rest of the measured step; h:
the host's time per op over the run's own). Per regime: each cell's host-bound share (its device idle share) and
model; the speedups on hosts 0.5-2x as slow as the W=2 run's (where the table's W=2 speedup was measured); the
hosts, from 1/4 to 8x as slow, on which the regime reproduces "1.66x at W=2, little beyond" (regimes.verdict), or
that none does. Where the same regime but the host was run on an emulated slower host (--host-slowdown), the model
of the host as it is predicts those runs from their measured host speed: predicted against measured steps and
speedups, the model's error.
"""

from flux_cp.predict.host import HostModel, fit, host_us, ranges, speedups_at

from .regimes import alt_key, host_slowdown, verdict
from .tables import md_table

GRID = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)  # host slowdowns report.json gives speedups at (x the W=2 run's host)
SHOWN = (0.5, 1.0, 1.5, 2.0)  # report.md's columns of them
SCAN = tuple(2 ** (i / 64) for i in range(-128, 193))  # 1/4 .. 8x as slow, ~1% apart: where the verdict holds
UNSTEADY = 2.0  # a check's host probes whose slowest repetition took this many times the fastest: a moving host


def _nominal(d: dict) -> float:
    """The run's emulated slowdown as set (host_load's nominal share where recorded)."""
    return (d.get("host_load") or {}).get("nominal_slowdown") or host_slowdown(d)


def _idle_share(d: dict) -> float | None:
    return (d.get("idle") or {}).get("device_idle_frac")


def host_axis(rep) -> None:
    """Adds each regime's `host_axis` (its summary) and each cell's host-bound share, model and speedups by host
    (its cells) to rep.regimes; then the checks of the host-as-is model on the slowed hosts' runs."""
    reg = rep.regimes or {}
    summary, cells = reg.get("summary") or {}, reg.get("cells") or []
    by_path = {str(r.path): r for r in rep.runs}
    models: dict[str, tuple[HostModel | None, dict[int, HostModel | None]]] = {}
    for rid, s in summary.items():
        base, why = fit(by_path[s["baseline"]["path"]].d)
        chosen, whys, fitted = {}, {} if base else {1: why}, []
        for c in (c for c in cells if c["regime"] == rid):
            d = by_path[c["path"]].d
            m, cwhy = fit(d, extra_ms=c["predicted_step_ms"] - c["step_ms"])
            c["host_bound_share"] = m.host_bound_share if m else _idle_share(d)
            c["host_issue_ms"] = m.host_issue_ms if m else None
            c["host_us"] = host_us(d)
            c["host_model"] = m.to_dict() if m else None
            fitted.append((c, m))
            if s["basis"].get(str(c["W"])) == c["basis"]:  # the cell the regime's speedups use
                chosen[c["W"]] = m
                if m is None:
                    whys[c["W"]] = cwhy
        # h = 1 is the host the W=2 step was measured on: where its measured speedup (the regime table's) holds.
        # The W=1 run's own probe may read another speed on a lent host that moves (3-8 us/op within one lease).
        ref = chosen[2].host_us if chosen.get(2) else None  # None: the W=1 run's (speedups_at, _axis)
        for c, m in fitted:
            c["speedup_at_host"] = ({f"{h:g}": speedups_at(base, {c["W"]: m}, h, ref)[c["W"]] for h in GRID}
                                    if base and m else None)
        models[rid] = (base, chosen)
        s["host_axis"] = _axis(base, chosen, whys, ref) | {"checks": []}
    _checks(summary, cells, models, by_path)


def _axis(base: HostModel | None, cells: dict[int, HostModel | None], whys: dict[int, str],
          ref_us: float | None = None) -> dict:
    """A regime's speedups along the host axis, h in multiples of `ref_us` (the W=2 run's host; default the W=1
    run's), and the statement of where it reproduces."""
    ref_us = ref_us or (base.host_us if base else None)
    out = {"baseline_model": base.to_dict() if base else None, "reference_us": ref_us,
           "speedups": None, "reproduces_h": [], "statement": None}
    if whys:
        w, why = min(whys.items())
        out["statement"] = f"not modelled: {'the W=1 baseline' if w == 1 else f'W={w}'}: {why}"
        return out
    out["speedups"] = {f"{h:g}": {str(w): v for w, v in speedups_at(base, cells, h, ref_us).items()} for h in GRID}
    if 2 not in cells:
        out["statement"] = "not tested: no W=2 run"
        return out
    sp = [speedups_at(base, cells, h, ref_us) for h in SCAN]
    ok = [verdict(s)[0] == "reproduces" for s in sp]
    out["reproduces_h"] = [list(r) for r in ranges(list(SCAN), ok)]
    u = ref_us
    ref = f"x the W=2 run's host, {u:.3g} us/op" if u else "x the W=2 run's host (its speed not recorded)"

    def at(lo, hi):
        return (f"{u * lo:.3g}-{u * hi:.3g} us/op (h = {lo:.2f}-{hi:.2f})" if u else f"h = {lo:.2f}-{hi:.2f}")

    if out["reproduces_h"]:
        out["statement"] = (f"reproduces on hosts of {', '.join(at(lo, hi) for lo, hi in out['reproduces_h'])}; "
                            f"h: {ref}")
    else:
        i = max(range(len(SCAN)), key=lambda i: sp[i][2])
        out["statement"] = (f"reproduces on no host from h = {SCAN[0]:.2g} to {SCAN[-1]:g} ({ref}): W=2 is at most "
                            f"{sp[i][2]:.2f}x (at {at(SCAN[i], SCAN[i])}); at h = 1: "
                            f"{verdict(sp[SCAN.index(1.0)])[1]}")
    return out


def _checks(summary: dict, cells: list[dict], models: dict, by_path: dict) -> None:
    """Each slowed regime against the same regime on the host as it is (all settings but --host-slowdown alike): that
    regime's models, at each slowed run's measured host speed, against the slowed runs' steps and speedups."""
    groups: dict[tuple, list[str]] = {}
    for rid, s in summary.items():
        d = by_path[s["baseline"]["path"]].d
        groups.setdefault((alt_key(d, with_compile=True, with_host=False), s["baseline"]["kind"]), []).append(rid)
    for rids in groups.values():
        refs = [r for r in rids if summary[r]["host"] == "host as is" and models[r][0] is not None]
        if not refs:
            continue
        ref = refs[0]
        base, by_w = models[ref]
        ref_nominal = _nominal(by_path[summary[ref]["baseline"]["path"]].d)
        for rid in rids:
            if summary[rid]["host"] == "host as is":
                continue
            s = summary[rid]
            runs = {1: s["baseline"]["path"]} | {c["W"]: c["path"] for c in cells if c["regime"] == rid
                                                 and s["basis"].get(str(c["W"])) == c["basis"]}
            rows, pred = [], {}
            for W, path in sorted(runs.items()):
                m = base if W == 1 else by_w.get(W)
                if m is None:
                    continue
                d = by_path[path].d
                h = m.h_of(host_us(d), _nominal(d) / ref_nominal)
                measured = d["metrics"]["step_ms"]["median"]
                pred[W] = (m, h)
                rows.append({"W": W, "run": d["run_name"], "h": h, "h_source": "measured" if host_us(d) and
                             m.host_us else "nominal (host speed not recorded)", "predicted_step_ms": m.step_at(h),
                             "measured_step_ms": measured, "error_pct": 100 * (m.step_at(h) / measured - 1),
                             "probe_range_us": _probe_range(d)})
            if 1 in pred:
                b, hb = pred[1]
                for row in rows:
                    if row["W"] > 1 and str(row["W"]) in s["speedups"]:
                        m, h = pred[row["W"]]
                        row["predicted_speedup"] = b.projected_at(hb) / m.projected_at(h)
                        row["measured_speedup"] = s["speedups"][str(row["W"])]
                        row["speedup_error_pct"] = 100 * (row["predicted_speedup"] / row["measured_speedup"] - 1)
            if not rows:
                continue
            ranges = [r["probe_range_us"] for r in rows if r["probe_range_us"]]
            check = {"regime": rid, "against": ref, "host": s["host"], "rows": rows,
                     "max_abs_error_pct": max(abs(r["error_pct"]) for r in rows),
                     # the slowed runs' host probes, every repetition: where they spread wider than the slowdown
                     # the model is checked on a host that moved while it was measured
                     "probe_range_us": [min(a for a, _ in ranges), max(b for _, b in ranges)] if ranges else None}
            s["host_axis"]["checks"].append(check)
            summary[ref]["host_axis"]["checks"].append(check)
            for c in cells:
                if c["regime"] == rid:
                    c["host_check"] = next((r for r in rows if r["W"] == c["W"]), None)


def _probe_range(d: dict) -> list[float] | None:
    """The fastest and slowest repetition of the run's host probes, before and after its steps (us per op)."""
    probes = [p for p in ((d.get("host_speed") or {}).get(k) for k in ("before", "after")) if p and "min_us" in p]
    return [min(p["min_us"] for p in probes), max(p["max_us"] for p in probes)] if probes else None


# ---------------------------------------------------------------- report.md


def host_axis_md(report) -> list[str]:
    """The regime table's host axis: a table of each modelled regime's cells, then each regime's statement and the
    model's error on slowed hosts."""
    summary = (report.regimes or {}).get("summary") or {}
    cells = (report.regimes or {}).get("cells") or []
    if not any("host_axis" in s for s in summary.values()):
        return []
    out = ["### The host as an axis", "",
           "Each run's step modelled from its idle probes as step(h) = max(D, H x h) + r: D the device's busy time, "
           "H the host's own time to issue the step, r the rest of the measured step, h the host's time per op (its "
           "probe, summary.json host_speed) over the run's own; a simulated rank's priced communication added as at "
           "h = 1. Speedups below on hosts h times as slow as the regime's W=2 run's (h < 1: faster; h = 1: the host "
           "the regime table's W=2 speedup was measured on); host-bound share: the device's idle share of the step.",
           ""]
    hdr = ["#", "W", "host-bound share", "busy / issue ms", *[f"h={h:g}" for h in SHOWN]]
    rows, lines, skipped = [], [], []
    for i, (rid, s) in enumerate(summary.items(), 1):
        ax = s.get("host_axis") or {}
        if ax.get("speedups") is None:
            skipped.append(f"{i} ({ax.get('statement')})")
            continue
        b = ax["baseline_model"]
        rows.append([str(i), "1", _pct(b["host_bound_share"]), _ms(b), *["-" for _ in SHOWN]])
        for c in sorted((c for c in cells if c["regime"] == rid and c.get("host_model")
                         and s["basis"].get(str(c["W"])) == c["basis"]), key=lambda c: c["W"]):
            rows.append([str(i), str(c["W"]), _pct(c["host_bound_share"]), _ms(c["host_model"]),
                         *[f"{c['speedup_at_host'][f'{h:g}']:.2f}x" for h in SHOWN]])
        lines.append(f"- **{i}.** {ax['statement']}.")
        for ck in ax["checks"] if s["host"] == "host as is" else []:
            lines.append(f"  - on {ck['host']} (regime {list(summary).index(ck['regime']) + 1}), predicted from "
                         f"these runs: " + "; ".join(_check(r) for r in ck["rows"])
                         + f" (largest error {ck['max_abs_error_pct']:.1f}%)" + _unsteady(ck))
    if rows:
        out += [md_table(hdr, rows), ""]
    out += lines + ([f"- Not modelled: regime {', '.join(skipped)}."] if skipped else []) + [""]
    return out


def _unsteady(check: dict) -> str:
    lo, hi = check.get("probe_range_us") or (0, 0)
    if not lo or hi / lo < UNSTEADY:
        return ""
    return (f"; the host moved while measured (probe repetitions {lo:.3g}-{hi:.3g} us/op over these runs, wider "
            "than the slowdown): the error is the host's as much as the model's")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _ms(m: dict) -> str:
    return f"{m['device_busy_ms']:.3g} / {m['host_issue_ms']:.3g}" + (" (stalled)" if m["stalled"] else "")


def _check(r: dict) -> str:
    sp = (f", speedup {r['predicted_speedup']:.2f}x vs {r['measured_speedup']:.2f}x" if "predicted_speedup" in r
          else "")
    return (f"W={r['W']} at h = {r['h']:.2f} step {r['predicted_step_ms']:.3g} vs {r['measured_step_ms']:.3g} ms "
            f"({r['error_pct']:+.1f}%){sp}")
