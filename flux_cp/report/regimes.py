"""Regimes (issue 24): which W=1 baseline and which work per step give the user's 1.66x, from the run folders alone.

The user's configuration: torch's ring (`cp: torch`, `rotate: allgather`), DDP, SDPA setting auto (the ring pins
flash), bf16, 4608 tokens, pure CP; batch, depth, compile and the harness vary as the regime's axes. A regime is
everything a speedup depends on but W: the W=1 baseline it divides (a `--cp none` run, labelled by the SDPA kernel it
ran, or `--cp torch` at world size 1: the seed script's --nproc-per-node 1 case), batch, depth (double + single
blocks), compile, harness and Lightning's SIGTERM sync cadence. A cell pairs one W >= 2 run of the user's
configuration with one W=1 baseline of the same device, model, data and run settings but the strategy's, the world's
and bookkeeping (match_key). A simulated rank's step is the report's prediction (analysis.analyse_row: compute
measured, communication priced from its ledger by predict.step_model with the --link profile, with its bounds); real
processes' is their measured step. Per regime: "reproduces" when W=2 is within 10% of 1.66x and no larger W adds 25%
or more over W=2, "does not reproduce" (with the reason), "incomplete" without a W=2 cell; and the mechanism, from the
runs' numbers (reconcile's waterfall, the W=2 rank's device busy against its host time).
"""

import json
import math

from flux_cp.config import CONFIG_DIR, RUN_GROUPS
from flux_cp.predict.host import host_us
from flux_cp.predict.links import for_world

from .analysis import analyse_row
from .devices import across_devices
from .reconcile import RING, USER_SPEEDUP, WATERFALL, _waterfall, baseline_kind, kernel, labels, split
from .runs import BOOKKEEPING, Run, _first_line, harness, strategy_label

TOLERANCE = 0.10  # W=2 within 10% of the user's 1.66x
BEYOND = 1.25  # "little gain beyond 2": a larger W's speedup under 1.25x the W=2 one
USER_SEQ = 4608
USER_RUN = {"cp": "torch", "rotate": "allgather", "weights": "ddp", "sdpa_backend": "auto"}
# run settings a baseline may differ in from the W >= 2 run, and another configuration from the user's: the strategy's
# (a plain W=1 step has none; every Parallelism setting: rotation, Ulysses' and ZeRO's options, ...), the world's,
# bookkeeping; compile and the step graph, and the harness's sync, compared as the regime's labels (normalised:
# compile_label, sync_label)
IGNORED = frozenset((*BOOKKEEPING, *RUN_GROUPS["Parallelism"], *RUN_GROUPS["Compile"], "devices", "num_nodes",
                     "accelerator"))
KERNEL_ORDER = ("cudnn", "flash", "efficient", "math", "auto")


# ---------------------------------------------------------------- what a run is


def _weights(d: dict) -> str:
    w = d.get("weights") or d["config"]["run"].get("weights", "ddp")
    return {"zero": "ddp"}.get(w, w) if d["world_size"] == 1 else w  # ZeRO-1 at W=1 is DDP's step


def _seq(d: dict) -> int:
    data = d["config"]["data"]
    return data["image_height"] * data["image_width"] + data["text_tokens"]


def depth(d: dict) -> str:
    m = d["config"]["model"]
    return f"{m.get('double_blocks')}+{m.get('single_blocks')}"


def compile_label(run: dict) -> str:
    """How the step was built: eager or compiled (mode, scope, backend), and replayed from one CUDA graph or not."""
    graph = " + step graph" if run.get("step_graph") else ""
    if not run.get("compile"):
        return "eager" + graph
    what = [run.get("compile_mode") or "default"]
    what += [f"scope {s}"] if (s := run.get("compile_scope") or "blocks") != "blocks" else []
    what += [b] if (b := run.get("compile_backend") or "inductor") != "inductor" else []
    return f"compiled ({', '.join(what)})" + graph


def sigterm_every(d: dict) -> int | None:
    """Lightning's SIGTERM check cadence (None for the bare loop); summaries before the setting: every step."""
    if harness(d) == "bare":
        return None
    n = d["config"]["run"].get("sigterm_every")
    return 1 if n is None else int(n)


def host_slowdown(d: dict) -> float:
    return float(d["config"]["run"].get("host_slowdown") or 1)


def host_label(d: dict) -> str:
    k = host_slowdown(d)
    return "host as is" if k == 1 else f"host 1/{k:g} (emulated)"


def _median_run(runs: list[Run]) -> tuple[Run, str | None]:
    """The run with the median step of repeated runs of one cell (a real run, not an average; the lower middle of an
    even count), and a note with the spread when there are several. On the H200 a host-bound W >= 2 step moved ~15%
    between runs of one configuration: one run is not a figure."""
    runs = sorted(runs, key=lambda r: (r.metric("step_ms") or 0.0, str(r.path)))
    mid = runs[(len(runs) - 1) // 2]
    if len(runs) == 1:
        return mid, None
    steps = [r.metric("step_ms") or 0.0 for r in runs]
    return mid, f"median of {len(runs)} runs ({min(steps):.3g}-{max(steps):.3g} ms), {mid.name}"


def sync_label(d: dict) -> str:
    n = sigterm_every(d)
    return "bare" if n is None else "lightning (SIGTERM sync every step)" if n == 1 else f"lightning (sync every {n})"


def alt_key(d: dict, with_compile: bool = False, with_host: bool = True) -> str:
    """What another configuration shares with a regime's runs to stand in for the user's: device, model, data (not
    the seed), every run setting but the strategy's, the world's, compile and bookkeeping, harness and sync cadence,
    loader and timing (a recipe may change the strategy and compile; the host, batch, depth and precision stay).
    with_host=False: the same but the host's emulated slowdown (one regime on other hosts: report/host_axis.py)."""
    cfg, run = d["config"], d["config"]["run"]
    rest = {k: v for k, v in run.items() if k not in IGNORED} | {"host_slowdown": host_slowdown(d) if with_host else
                                                                 None}  # 2 and 2.0 (an older summary) alike
    data = {k: v for k, v in cfg["data"].items() if k != "seed"}
    return json.dumps([d["mode"], d["env"]["device"], cfg["model"], data, rest, sync_label(d),
                       run.get("loader", "device"), run.get("timing", True),
                       *([compile_label(run)] if with_compile else [])], sort_keys=True)


def match_key(d: dict) -> str:
    """What a W >= 2 run and its W=1 baseline share: alt_key's settings and the compile setting too."""
    return alt_key(d, with_compile=True)


def sdpa_setting(run: dict) -> str:
    """The SDPA setting as the user's configuration reads it: the ring's explicit flash is its auto (it pins flash;
    LoRA runs of 2026-12-07 recorded the pin)."""
    b = run.get("sdpa_backend", "auto")
    return "auto" if b == "flash" and run.get("cp") in ("torch", "allgather-kv") else b


def is_user(r: Run) -> bool:
    """A W >= 2 run of the user's configuration (simulated or real)."""
    d, run = r.d, r.d["config"]["run"]
    return (d["mode"] == "train" and r.W >= 2 and d["cp"] == USER_RUN["cp"] and _weights(d) == USER_RUN["weights"]
            and run.get("rotate", "allgather") == USER_RUN["rotate"]
            and sdpa_setting(run) == USER_RUN["sdpa_backend"]
            and str(run.get("precision")).startswith("bf16") and _seq(d) == USER_SEQ
            and not run.get("split_conditioning") and run.get("cp_degree") in (None, r.W))


def is_baseline(r: Run) -> bool:
    """A W=1 run a speedup may divide: plain (`--cp none`), or the user's ring at world size 1."""
    d, run = r.d, r.d["config"]["run"]
    if d["mode"] != "train" or r.W != 1 or r.simulated:
        return False
    return d["cp"] == "none" or (d["cp"] == USER_RUN["cp"] and run.get("rotate", "allgather") == USER_RUN["rotate"]
                                 and _weights(d) == USER_RUN["weights"]
                                 and sdpa_setting(run) == USER_RUN["sdpa_backend"])


def kernel_note(base: dict, ring: dict) -> str | None:
    """Said on every cell whose baseline ran another SDPA kernel than the W >= 2 ring run (the ring pins flash)."""
    bk, rk = kernel(base), kernel(ring)
    if bk == "auto":
        return (f"the baseline's SDPA kernel is not recorded (setting auto, an older summary): it may differ from the "
                f"ring's {rk}")
    if bk != rk:
        return (f"baseline SDPA kernel {bk}, the ring's {rk}: the speedup includes the change of kernel, not only "
                "the split")
    return None


# ---------------------------------------------------------------- cells and verdicts


def _mechanism(kind: str, base: dict, a: dict, W: int, run: Run) -> str:
    """One sentence, the cell's numbers: the W=1 step, the W step, device busy vs host, and the largest loss. Where the
    runs record no device idle or busy time (a bare loop's), host-bound time is not told from compute: said so."""
    t1, tw = base["step_ms"], a["projected_step_ms"]
    how = "predicted" if a["collectives"] == "fake" else "measured"
    wf = _waterfall(base, a, W)
    names = labels(split(base, a))
    losses = {{WATERFALL[4]: "communication (exposed)", WATERFALL[1]: "attention (chunking)",
               WATERFALL[2]: "host-bound (device idle)"}.get(k, names[k]): wf[k] for k in WATERFALL[1:] if names[k]}
    top = max(losses, key=losses.get)
    rest = sorted(((k, v) for k, v in losses.items() if k != top), key=lambda x: -x[1])
    busy, host, step = run.metric("device_busy_ms"), a["host_ms"], a["step_ms"]
    issue = run.metric("host_issue_ms")  # the probe's: the host's own time, no wait on the device in it
    if busy is not None:
        bound = "host-bound" if busy < 0.9 * step else "device-bound"
        took = f"issues it in {issue:.3g} ms" if issue else f"takes {host:.3g} ms"
        dev = f"the W={W} rank's device is busy {busy:.3g} ms of its {step:.3g} ms step, its host {took}: {bound}"
    else:
        dev = (f"device busy not recorded at W={W} ({harness(run.d)} loop: host-bound share not recorded), host "
               f"{host:.3g} ms per {step:.3g} ms step")
    return (f"{kind}: W=1 step {t1:.3g} ms, W={W} {how} {tw:.3g} ms ({t1 / tw:.2f}x, ideal {wf[WATERFALL[0]]:.3g} ms); "
            f"{dev}; against the ideal the step is {tw - wf[WATERFALL[0]]:+.3g} ms, the largest part {top} "
            f"{losses[top]:+.3g} ms (" + ", ".join(f"{k} {v:+.3g}" for k, v in rest) + " ms)")


def verdict(speedups: dict[int, float]) -> tuple[str, str]:
    """(verdict, reason) of one regime from its speedups by W."""
    lo, hi = USER_SPEEDUP * (1 - TOLERANCE), USER_SPEEDUP * (1 + TOLERANCE)
    s2 = speedups.get(2)
    if s2 is None:
        return "incomplete", (f"no W=2 run (only W={', '.join(map(str, sorted(speedups)))}): the user's "
                              f"{USER_SPEEDUP}x is not tested")
    why, more = [], []
    if not lo <= s2 <= hi:
        far = "far " if abs(s2 / USER_SPEEDUP - 1) > 2 * TOLERANCE else ""
        why.append(f"W=2 {s2:.2f}x, {far}{'below' if s2 < lo else 'above'} {USER_SPEEDUP}x (band {lo:.2f}-{hi:.2f}x)")
    for w, s in sorted(speedups.items()):
        if w > 2:
            (why if s / s2 >= BEYOND else more).append(f"W={w} adds {s / s2 - 1:.0%} over W=2 ({s:.2f}x)")
    if why:
        return "does not reproduce", "; ".join(why)
    beyond = "; " + ", ".join(more) + f": under {BEYOND - 1:.0%}" if more else "; no W > 2 run"
    return "reproduces", f"W=2 {s2:.2f}x, within {TOLERANCE:.0%} of {USER_SPEEDUP}x" + beyond


def _label_ids(keys: dict) -> dict:
    """Readable regime ids; the device (then a number) added where two regimes would read the same."""
    names = {k: " | ".join((v["baseline"]["kind"], f"batch {v['batch']}", f"depth {v['depth']}", v["compile"],
                            v["lightning_sync"], *([v["host"]] if v["host"] != "host as is" else [])))
             for k, v in keys.items()}
    out = {}
    for k, n in names.items():
        same = [x for x in keys if names[x] == n]
        if len(same) > 1:
            n += f" | {keys[k]['device']}"
            if sum(names[x] + f" | {keys[x]['device']}" == n for x in same) > 1:
                n += f" #{same.index(k) + 1}"
        out[k] = n
    return out


def _order(v: dict) -> tuple:
    kind = v["baseline"]["kind"]
    k = KERNEL_ORDER.index(v["baseline"]["sdpa_kernel"]) if v["baseline"]["sdpa_kernel"] in KERNEL_ORDER else 9
    blocks = tuple(int(x) if x.isdigit() else 0 for x in v["depth"].split("+"))
    return (v["device"], v["host"] != "host as is", v["host"], v["harness"], v["lightning_sync"], v["compile"],
            sum(blocks), blocks, v["batch"], kind == RING, k, kind)


def regimes(report) -> dict:
    """{"cells": [...], "summary": {regime id: ...}, "unpaired": [...], "notes": [...]} for report.json."""
    notes, users, bases = [], {}, {}
    for r in report.runs:
        try:
            if r.d["mode"] != "train":
                continue
            if is_user(r):
                users.setdefault((match_key(r.d), r.W, "predicted" if r.fake_collectives else "measured"), []).append(r)
            elif is_baseline(r):
                bases.setdefault(match_key(r.d), {}).setdefault(baseline_kind(r.d), []).append(r)
        except (KeyError, TypeError, ValueError) as e:
            notes.append(f"{r.name}: left out of the regimes ({type(e).__name__}: {_first_line(e)})")
    rows: dict[str, dict] = {}

    def row(run: Run, W: int) -> dict:  # the report's own analysis of one run (cached per run)
        if str(run.path) not in rows:
            link = report.link if run.on_gpu else report.cpu_link
            rows[str(run.path)] = analyse_row(run, W, for_world(link, W) if W > 1 else None)
        return rows[str(run.path)]

    regs: dict[tuple, dict] = {}
    unpaired = []
    for (mk, W, basis), group in sorted(users.items(), key=lambda x: (x[0][0], x[0][1], x[0][2])):
        run, spread = _median_run(group)
        if not bases.get(mk):
            unpaired.append({"run": run.name, "path": str(run.path), "W": W, "batch": run.d["config"]["data"][
                "batch_size"], "depth": depth(run.d), "compile": compile_label(run.d["config"]["run"]),
                "lightning_sync": sync_label(run.d)})
            continue
        for kind, candidates in bases[mk].items():
            b, bspread = _median_run(candidates)
            try:
                base, a = row(b, 1), row(run, W)
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
                notes.append(f"{run.name} with {b.name}: not analysed ({type(e).__name__}: {_first_line(e)})")
                continue
            reg = regs.setdefault((mk, kind), {
                "baseline": {"kind": kind, "sdpa_kernel": kernel(b.d), "sdpa_backend": b.d["config"]["run"].get(
                    "sdpa_backend", "auto"), "cp": b.d["cp"], "run": b.name, "path": str(b.path),
                    "step_ms": base["step_ms"]},
                "batch": run.d["config"]["data"]["batch_size"], "depth": depth(run.d),
                "compile": compile_label(run.d["config"]["run"]), "harness": harness(run.d),
                "lightning_sync": sync_label(run.d), "sigterm_every": sigterm_every(run.d),
                "host": host_label(run.d), "device": run.d["env"]["device"], "alt": alt_key(run.d), "cells": [],
                "notes": []})
            if bspread and (n := f"W=1: {bspread}") not in reg["notes"]:
                reg["notes"].append(n)
            if spread:
                reg["notes"].append(f"W={W} ({basis}): {spread}")
            p, t1, pred = a["prediction"], base["step_ms"], a["projected_step_ms"]
            fake = a["collectives"] == "fake"
            reg["cells"].append({
                "W": W, "basis": basis, "run": run.name, "path": str(run.path), "sdpa_kernel": kernel(run.d),
                "step_ms": a["step_ms"], "baseline_step_ms": t1, "predicted_step_ms": pred,
                "speedup": t1 / pred, "speedup_bounds": [t1 / p["upper_ms"], t1 / p["lower_ms"]] if fake else
                [None, None], "link": p["link"] if fake else None, "comm_source": p["source"] if fake else
                "measured (real processes)", "kernel_note": kernel_note(b.d, run.d),
                "host_ms": a["host_ms"], "device_busy_ms": run.metric("device_busy_ms"),
                # the host's speed: its probes before and after the steps (the host axis's measure too)
                "host_op_us": host_us(run.d),
                "mechanism": _mechanism(kind, base, a, W, run)})
    ids = _label_ids(regs)
    cells, summary = [], {}
    for key, reg in sorted(regs.items(), key=lambda x: _order(x[1])):
        rid = ids[key]
        by_w: dict[int, dict] = {}
        for c in sorted(reg["cells"], key=lambda c: (c["W"], c["basis"])):  # measured before predicted
            by_w.setdefault(c["W"], c)
        speedups = {w: c["speedup"] for w, c in by_w.items()}
        v, why = verdict(speedups)
        first = by_w.get(2) or by_w[min(by_w)]
        head = {k: reg[k] for k in ("baseline", "batch", "depth", "compile", "harness", "lightning_sync",
                                    "sigterm_every", "host", "device")}
        summary[rid] = {**head, "host_op_us": first["host_op_us"], "verdict": v, "reason": why,
                        "mechanism": first["mechanism"],
                        "speedups": {str(w): s for w, s in sorted(speedups.items())},
                        "bounds": {str(w): c["speedup_bounds"] for w, c in sorted(by_w.items())},
                        "basis": {str(w): c["basis"] for w, c in sorted(by_w.items())},
                        "kernel_note": first["kernel_note"], "notes": reg["notes"]}
        for c in sorted(reg["cells"], key=lambda c: (c["W"], c["basis"])):
            cells.append({"regime": rid, **head, "W": c["W"], "step_ms": c["step_ms"],
                          "baseline_step_ms": c["baseline_step_ms"], "predicted_step_ms": c["predicted_step_ms"],
                          "speedup": c["speedup"], "speedup_bounds": c["speedup_bounds"], "verdict": v, "reason": why,
                          "mechanism": c["mechanism"], "run": c["run"],
                          **{k: c[k] for k in ("basis", "path", "sdpa_kernel", "kernel_note", "link", "comm_source",
                                               "host_ms", "device_busy_ms", "host_op_us")}})
    alternatives = {ids[key]: _candidates(report.runs, reg, row, notes) for key, reg in regs.items()}
    head, why = headline_regime(summary)
    for rid, s in summary.items():
        if s["verdict"] == "reproduces" or rid == head:
            s["best"] = best_of(alternatives[rid])
    # "_rows" (each run's analysis) and "_alternatives" are for the report's other sections, not report.json
    return {"cells": cells, "summary": summary, "unpaired": unpaired, "notes": notes, "headline": head,
            "headline_kind": why, "across_devices": across_devices(summary), "_rows": rows,
            "_alternatives": alternatives}


def headline_regime(summary: dict) -> tuple[str | None, str]:
    """The regime the report's verdict names, and why that one: the first that reproduces the 1.66x (table order),
    else the one closest to it at W=2, else (no regime has a W=2 run) the first."""
    if not summary:
        return None, "none"
    if hits := [rid for rid, s in summary.items() if s["verdict"] == "reproduces"]:
        return hits[0], "reproduces"
    near = [(abs(math.log(s["speedups"]["2"] / USER_SPEEDUP)), i, rid) for i, (rid, s) in enumerate(summary.items())
            if s["speedups"].get("2")]
    return (min(near)[2], "closest") if near else (next(iter(summary)), "incomplete")


def _candidates(runs: list[Run], reg: dict, row, notes: list[str]) -> list[dict]:
    """Every configuration run in a regime's device, model, data, host and harness (any strategy, weights or compile;
    repeats of one configuration: their median run) at each W >= 2, with its speedup over the regime's W=1 baseline:
    what the user could run instead (issue 24), fastest first at each W."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.d["mode"] == "train" and r.W >= 2 and alt_key(r.d) == reg["alt"]:
            groups.setdefault((r.W, strategy_label(r.d), compile_label(r.d["config"]["run"])), []).append(r)
    t1, out = reg["baseline"]["step_ms"], []
    for (W, strategy, compiled), group in sorted(groups.items()):
        r, _ = _median_run(group)
        try:
            a = row(r, W)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            notes.append(f"{r.name}: not ranked ({type(e).__name__}: {_first_line(e)})")
            continue
        ms, p, fake = a["projected_step_ms"], a["prediction"], a["collectives"] == "fake"
        out.append({"W": W, "strategy": strategy, "compile": compiled, "run": r.name, "path": str(r.path),
                    "predicted_step_ms": ms, "speedup": t1 / ms,
                    "bounds": [t1 / p["upper_ms"], t1 / p["lower_ms"]] if fake else None,
                    "basis": "predicted" if fake else "measured",
                    "users": is_user(r) and compiled == reg["compile"],  # the user's own configuration
                    "recipe": recipe_for(r.d["config"]["run"]), "peak_gib": a.get("peak_gib")})
    return sorted(out, key=lambda x: (x["W"], x["predicted_step_ms"]))


def best_of(candidates: list[dict]) -> dict:
    """The fastest candidate at each W ({str(W): candidate})."""
    best: dict[str, dict] = {}
    for c in candidates:  # fastest first at each W
        best.setdefault(str(c["W"]), c)
    return best


def recipe_for(run: dict) -> str | None:
    """The recipe (configs/recipes/*.yaml: run settings only) that this run's settings all match, as its path."""
    import yaml

    from flux_cp.config import RunConfig

    default = RunConfig()  # a setting newer than the run's summary: the run had its default
    for path in sorted((CONFIG_DIR / "recipes").glob("*.yaml")):
        settings = yaml.safe_load(path.read_text()) or {}
        if settings and all(run.get(k, getattr(default, k, None)) == v for k, v in settings.items()):
            return str(path.relative_to(CONFIG_DIR.parent))
    return None
