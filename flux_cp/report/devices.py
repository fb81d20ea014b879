"""What holds across GPU kinds: the regimes (report/regimes.py) that differ only by the device they ran on, side by
side, and whether the verdict is the same on each.

    across = across_devices(report.regimes["summary"])   # [] where every regime ran on one device
    lines = across_devices_md(across)                    # report.md, after the regime table

A regime is one W=1 baseline, batch, depth, compile setting, harness, Lightning sync cadence and host; the table sets
its W=1 step and speedups on one device beside another's. Device-bound steps should barely move between GPUs of one
architecture; host-bound ones follow the host of the lease (the host's speed, `host_op_us`, is shown where recorded),
so a verdict that holds on one GPU and not another names which part moved.
"""

from .tables import md_table

SAME = ("batch", "depth", "compile", "harness", "lightning_sync", "sigterm_every", "host")


def _key(s: dict) -> tuple:
    return (s["baseline"]["kind"], *(str(s.get(k)) for k in SAME))


def short_device(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100 80GB HBM3': the vendor left out of the tables."""
    return str(name).removeprefix("NVIDIA ").strip()


def across_devices(summary: dict) -> list[dict]:
    """One entry per regime measured on two GPU kinds or more: each device's W=1 step, speedups and verdict, and
    whether the verdict holds on all of them."""
    groups: dict[tuple, list[tuple[str, dict]]] = {}
    for rid, s in summary.items():
        if not str(s.get("device", "")).lower().startswith("cpu"):
            groups.setdefault(_key(s), []).append((rid, s))
    out = []
    for key, members in groups.items():
        by_device: dict[str, tuple[str, dict]] = {}
        for rid, s in members:
            by_device.setdefault(s["device"], (rid, s))  # table order: the first regime of each device
        if len(by_device) < 2:
            continue
        rows = [{"device": dev, "regime": rid, "baseline_step_ms": s["baseline"]["step_ms"],
                 "speedups": s["speedups"], "verdict": s["verdict"], "host_op_us": s.get("host_op_us")}
                for dev, (rid, s) in by_device.items()]
        verdicts = {r["verdict"] for r in rows}
        w1 = [r["baseline_step_ms"] for r in rows]
        out.append({"baseline": key[0], **dict(zip(SAME, key[1:])), "devices": rows,
                    "holds": len(verdicts) == 1, "verdicts": sorted(verdicts),
                    "w1_spread": max(w1) / min(w1) - 1})
    return out


def _speedup(r: dict, w: str) -> str:
    s = r["speedups"].get(w)
    return "-" if s is None else f"{s:.2f}x"


def across_devices_md(across: list[dict]) -> list[str]:
    """report.md's subsection: one table row per regime and device, then a line per regime: holds or differs."""
    if not across:
        return []
    out = ["### Across GPU kinds", "",
           "The regimes above that ran on more than one GPU kind (the same W=1 baseline, batch, depth, compile, "
           "harness and host setting), side by side. Device-bound steps move little between GPUs; host-bound ones "
           "follow the lease's host (us per tiny op, where recorded).", ""]
    hdr = ["regime", "device", "host us/op", "W=1 ms", "W=2", "W=4", "W=8", "verdict"]
    rows = []
    for i, a in enumerate(across, 1):
        for r in a["devices"]:
            us = "-" if r["host_op_us"] is None else f"{r['host_op_us']:.2g}"
            rows.append([str(i), short_device(r["device"]), us, f"{r['baseline_step_ms']:.1f}",
                         _speedup(r, "2"), _speedup(r, "4"), _speedup(r, "8"), r["verdict"]])
    out += [md_table(hdr, rows), ""]
    for i, a in enumerate(across, 1):
        what = (f"{a['baseline']}, batch {a['batch']}, depth {a['depth']}, {a['compile']}, {a['harness']}")
        devs = " vs ".join(short_device(r["device"]) for r in a["devices"])
        if a["holds"]:
            out.append(f"- **{i}. holds on {devs}** ({what}): {a['verdicts'][0]}; the W=1 step differs by "
                       f"{a['w1_spread']:.0%}.")
        else:
            each = "; ".join(f"{short_device(r['device'])}: {r['verdict']} (W=2 {_speedup(r, '2')})"
                             for r in a["devices"])
            out.append(f"- **{i}. differs** ({what}): {each}; the W=1 step differs by {a['w1_spread']:.0%}.")
    return out + [""]
