"""Analysis of one configuration: the step's parts at each W, speedups, comm priced by predict.step_model, verdicts.

Communication: every collective of the run (its comm.ledger, else the one predict.approximate_ledger derives
from the shapes) priced with a link profile chosen by device (GPU runs: --link; CPU runs: --cpu-link, a
gloo profile measured by tools/measure_links.py, or not priced at all) and placed on the step's
timeline. A simulated rank (fake collectives) measured compute only: its projected step is the
prediction. A real multi-rank step contains its communication: the predicted exposure is taken out of
it to name the parts (labelled an estimate).

Harness overhead (each Lightning row's step against its bare twin's): harness.py.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from flux_cp.config import DDP_WEIGHTS, run_setting
from flux_cp.predict.links import LinkProfile, for_world
from flux_cp.predict.step_model import approximate_ledger, fsdp_ahead, predict, predict_ledger

from .runs import (
    COMPUTE,
    OPS,
    PART_LABEL,
    Config,
    Run,
    Skipped,
    _latest,
    isolated_for,
    noise,
    ratio,
)

KV_KINDS = ("all_to_all", "send", "recv", "all_gather", "reduce_scatter")  # + FSDP's gathers: weights, below


def misses_grad_sync(run: Run) -> bool:
    """A DDP / ZeRO run of W >= 2 whose ledger holds no gradient all-reduce: --step-graph runs before 2026-12-04
    17:00, whose ledger tracked a capture per thread, then not through the stream DDP's reducer joins it by."""
    ledger = (run.d.get("comm") or {}).get("ledger")
    return (run.W > 1 and bool(ledger) and run.d.get("weights") in DDP_WEIGHTS
            and not any(c["kind"] == "all_reduce" for rec in ledger for c in rec["collectives"]))


# The run settings that change a step's collectives, or where they are waited on: an eager twin must share them
TWIN_SETTINGS = ("split_conditioning", "zero_bucket_view", "zero2_gather", "zero2_forward_share", "zero2_bucket_mb",
                 "ulysses_overlap")


def borrow_ledgers(runs: list[Run]) -> None:
    """Each --step-graph run whose ledger does not place its collectives, and each run whose ledger misses its
    gradient sync, is priced with an eager twin's ledger (no CUDA graph: every collective recorded where the step
    issues and waits on it), of the same device, model, data, precision, strategy (and the settings that change its
    collectives), weights mode and W. A step graph's own ledger holds the same collectives and bytes
    (tests/test_gpu.py) and, where its graph's events were read (graph_placed), their places: it keeps its own; else
    priced from it alone they would all be blocking. Compiling does not change a step's collectives
    (tests/test_recipes.py)."""
    def key(r: Run) -> str:
        run = r.d["config"]["run"]
        return json.dumps([r.d["env"]["device"], r.d["config"]["model"], r.d["config"]["data"], run["precision"],
                           r.d["cp"], run.get("rotate"), r.d.get("weights"), r.W,
                           # what changes the collectives themselves, or where they are waited on
                           run_setting(run, "ulysses_qkv") if r.d["cp"] == "ulysses" else None,
                           *(run_setting(run, k) for k in TWIN_SETTINGS)],
                          sort_keys=True)

    donors: dict[str, list[Run]] = {}
    for r in runs:
        if not r.d.get("step_graph") and (r.d.get("comm") or {}).get("ledger") and not misses_grad_sync(r):
            donors.setdefault(key(r), []).append(r)
    for r in runs:
        if r.W > 1 and (misses_grad_sync(r) or (r.d.get("step_graph") and not graph_placed(r))) and key(r) in donors:
            r.ledger_twin = _latest(donors[key(r)])[0]


def graph_placed(r: Run) -> bool:
    """Whether a step-graph run's ledger places its replayed collectives itself (each at its replay's start plus
    its offset, read from the graph's own events: flux_cp/measure/ledger.py), in every record."""
    ledger = (r.d.get("comm") or {}).get("ledger") or []
    graph = [c for rec in ledger for c in rec["collectives"] if c.get("graph")]
    return bool(graph) and all(c.get("placed") for c in graph)


def _ledger_note(run: Run, own_ledger: bool) -> str | None:
    """What the configuration's notes say of a W >= 2 run's ledger when it is not the run's own, whole one."""
    misses, twin = misses_grad_sync(run), run.ledger_twin
    if twin is not None and misses:
        return (f"its ledger misses the backward's collectives (a --step-graph run recorded before they were: "
                f"docs/archive/2026-12-04c-h200-session.md): priced with its eager twin's, {twin.name}")
    if twin is not None:
        return (f"its collectives replay inside one CUDA graph (the ledger has their bytes, not their place in the "
                f"step): placed as its eager twin's ledger places them, {twin.name}")
    if own_ledger and misses:
        return ("the ledger holds no gradient all-reduce (a --step-graph run recorded before its backward's "
                "collectives were: docs/archive/2026-12-04c-h200-session.md) and no eager twin among the runs has: "
                "that communication is not priced")
    if own_ledger and run.d.get("step_graph") and not graph_placed(run):
        return ("its collectives replay inside one CUDA graph and no eager twin among the runs places them: priced "
                "as blocking, one after another (the upper bound)")
    return None


def comm_prediction(run: Run, W: int, link: LinkProfile | None) -> dict:
    """The run's collectives priced with link and placed on its timeline (predict.py)."""
    d, step = run.d, run.metric("step_ms")
    if link is None:
        return {"source": "not priced (CPU run, no --cpu-link profile)", "link": None, "predicted_ms": step,
                "lower_ms": step, "upper_ms": step, "priced_ms": 0.0, "exposed_ms": 0.0, "kv_ms": 0.0,
                "grad_ms": 0.0, "exposed_ms_by_kind": {}, "priced_ms_by_kind": {}, "bytes_by_kind": {}}
    ledger = (d.get("comm") or {}).get("ledger")
    src = "ledger"
    if d.get("step_graph"):  # a step graph's ledger: placed by the graph's own events, else every collective blocking
        src = "ledger placed by the graph's events" if graph_placed(run) else "ledger, blocking (the upper bound)"
    if run.ledger_twin is not None:  # its own misses collectives or their place (borrow_ledgers)
        ledger, src = run.ledger_twin.d["comm"]["ledger"], f"ledger of its eager twin {run.ledger_twin.name}"
    if ledger:
        p = predict_ledger(ledger, link, step_ms=step, fsdp_ahead=fsdp_ahead(d))
        nbytes = {}
        for c in ledger[len(ledger) // 2]["collectives"]:
            nbytes[c["kind"]] = nbytes.get(c["kind"], 0) + c["bytes"]
    else:
        tl, colls = approximate_ledger(d, W, step_ms=step)
        p, src = predict(tl, colls, link), "byte counts"
        nbytes = {}
        for c in colls:
            nbytes[c.kind] = nbytes.get(c.kind, 0) + c.bytes
    # FSDP and ZeRO-2 gather weights and reduce-scatter gradients: those are the gradient sync, not the K/V exchange
    sharded = (d.get("weights") or d["config"]["run"].get("weights")) not in DDP_WEIGHTS
    kv_kinds = [k for k in KV_KINDS if not (sharded and k in ("all_gather", "reduce_scatter"))]
    kv = sum(v for k, v in p.exposed_ms_by_kind.items() if k in kv_kinds)
    return {"source": f"{src} priced with {link.name}" + ("" if link.measured else " (profile from sources)"),
            "link": link.name, "predicted_ms": p.predicted_ms, "lower_ms": p.lower_ms, "upper_ms": p.upper_ms,
            "priced_ms": p.comm_ms, "exposed_ms": p.exposed_ms, "kv_ms": kv, "grad_ms": p.exposed_ms - kv,
            "exposed_ms_by_kind": p.exposed_ms_by_kind, "priced_ms_by_kind": p.priced_ms_by_kind,
            "bytes_by_kind": nbytes}


def analyse_row(run: Run, W: int, link: LinkProfile | None) -> dict:
    """Parts of the step (ms) at W, where comm and idle come from, and the raw figures."""
    d = run.d
    step = run.metric("step_ms")
    regions = {op: run.metric(f"{op}_ms") for op in OPS}
    prof = d.get("profile") or {}
    bd = prof.get("breakdown_ms") or {}
    pred = comm_prediction(run, W, link) if W > 1 else comm_prediction(run, 1, None) | {"source": "none at W=1"}
    notes = [f"metric {m}: all NaN (not reported)" for m in d.get("nan_metrics", [])]
    if (W > 1 and d["cp"] != "none" and pred["source"].startswith("ledger")
            and not any(k in KV_KINDS for k in pred["bytes_by_kind"])):
        # Python never runs in a CUDA graph's replay, and the ledger listens from Python kernels
        notes.append("the ledger holds no K/V exchange (collectives replayed inside CUDA graphs, as under "
                     "reduce-overhead, never reach it): that communication is not priced")
    if W > 1 and (note := _ledger_note(run, pred["source"].startswith("ledger"))):
        notes.append(note)
    # A profile that found no comm kernels at W > 1 did not classify them: the prediction stands in.
    prof_comm = "comm_attention" in bd and "comm_grad" in bd and not run.fake_collectives and W > 1
    if prof_comm and not float(bd["comm_attention"]) + float(bd["comm_grad"]) > 0:
        prof_comm = False
        notes.append("the profile shows no communication kernels: comm predicted")
    if prof_comm:
        kv, grad, comm_src = float(bd["comm_attention"]), float(bd["comm_grad"]), "measured (profile)"
    else:
        kv, grad, comm_src = pred["kv_ms"], pred["grad_ms"], pred["source"]
    # Idle from the measured steps' probes first; the profiled steps are extra steps, slowed on the host
    # by the profiler, so their idle fraction is the fallback.
    if isinstance(d.get("idle"), dict) and d["idle"].get("device_idle_frac") is not None:
        idle, idle_src = float(d["idle"]["device_idle_frac"]) * step, d["idle"].get("source", "events")
    elif prof.get("idle_frac") is not None:
        idle, idle_src = float(prof["idle_frac"]) * step, "profile"
    elif (busy := run.metric("device_busy_ms")) is not None:  # a loop that times the device's busy time alone
        idle, idle_src = max(0.0, step - busy), "device busy (events)"
    elif (idle_ms := run.metric("device_idle_ms")) is not None:
        idle, idle_src = idle_ms, "device idle (events)"
    else:
        idle, idle_src = None, "not measured"
    # A real multi-rank step contains its exposed comm (K/V inside the SDPA regions, gradient sync outside
    # the op regions); a simulated rank's has none, and the prediction adds it on top.
    inside = not run.fake_collectives
    # op regions run in some steps only (--regions-every): their share of those steps, scaled to the plain step
    timed = run.metric("step_timed_ms")
    k = step / timed if timed else 1.0
    parts = {op: (regions[op] or 0.0) * k for op in OPS}
    in_regions = sum(parts.values())  # K/V waits included: taken out of the SDPA parts below, into comm_kv
    if inside:  # the K/V exchange split over fwd and bwd as the SDPA regions are
        fb = (regions["sdpa_fwd"] or 0.0) + (regions["sdpa_bwd"] or 0.0)
        share = (regions["sdpa_fwd"] or 0.0) / fb if fb else 0.5
        parts["sdpa_fwd"] = max(0.0, parts["sdpa_fwd"] - kv * share)
        parts["sdpa_bwd"] = max(0.0, parts["sdpa_bwd"] - kv * (1 - share))
    rest = step - in_regions - (grad if inside else 0.0) - (idle or 0.0)
    if rest < 0:
        notes.append(f"parts exceed the step by {-rest:.3g} ms (idle inside op regions, or comm overestimated)")
    parts["other"] = max(0.0, rest)
    parts |= {"comm_kv": kv, "comm_grad": grad, "idle": idle or 0.0}
    total = sum(parts.values())
    step_m = d["metrics"]["step_ms"]
    spread, spread_kind = run.spread("step_ms")
    return {
        "run": run.name, "path": str(run.path), "W": W, "world_size": d["world_size"], "simulated": run.simulated,
        "rank": (d.get("simulate") or {}).get("rank", 0),  # a simulated run's rank of the W-rank job
        "collectives": "fake" if run.fake_collectives else "real", "cp": d["cp"], "weights": d.get("weights", "ddp"),
        "device": d["env"]["device"], "timer": run.timer, "step_ms": step, "host_ms": run.metric("host_ms"),
        "step_spread_ms": spread, "step_spread_kind": spread_kind,
        # the loop's period on the host (data loading and hooks between steps included): what a user's wall
        # clock sees; older summaries lack it
        "loop_ms": run.metric("loop_ms"),
        "projected_step_ms": pred["predicted_ms"] if run.fake_collectives else step,
        "prediction": pred,
        "step_rank_spread_ms": step_m.get("rank_max_median", step) - step_m.get("rank_min_median", step),
        "regions_ms": regions, "call_ms": {op: run.metric(f"{op}_call_ms") for op in OPS},
        "profile_call_ms": prof.get("ops_call_ms"),
        "parts_ms": parts, "shares": {k: v / total if total else None for k, v in parts.items()},
        "comm_source": comm_src, "idle_ms": idle, "idle_source": idle_src,
        "idle_frac": None if idle is None or not step else idle / step,
        "compile_s": (d.get("compile") or {}).get("compile_s"), "notes": notes,
        "peak_gib": peak_gib(d),
        # samples a step trains (the global batch): a row training more than its W=1 baseline is held against that
        # many W=1 steps (per_work), its speedup a ratio of samples/s
        "samples_per_step": (d.get("throughput") or {}).get("samples_per_step") or 1,
    }


def per_work(base: dict, a: dict) -> dict:
    """The W=1 baseline's figures for as many samples as row `a` trains a step (f = a's samples / base's): its times
    f times over, so that a speedup is the ratio of samples/s (data parallelism at B = W: ideal W, as one sample at
    B = 1 under CP). The baseline itself where they train alike."""
    f = a.get("samples_per_step", 1) / (base.get("samples_per_step") or 1)
    if f == 1:
        return base
    times = lambda d: {k: (None if v is None else v * f) for k, v in d.items()}  # noqa: E731
    return {**base, "step_ms": base["step_ms"] * f, "projected_step_ms": base["projected_step_ms"] * f,
            "loop_ms": None if base.get("loop_ms") is None else base["loop_ms"] * f,
            "step_spread_ms": None if base.get("step_spread_ms") is None else base["step_spread_ms"] * f,
            "parts_ms": times(base["parts_ms"]), "regions_ms": times(base["regions_ms"]),
            "samples_per_step": a.get("samples_per_step", 1), "work_factor": f}


def peak_gib(d: dict) -> float | None:
    """This rank's peak memory over the steps (summary.json `memory`: CUDA allocated, else the CPU process's RSS)."""
    mem = d.get("memory") or {}
    return mem.get("allocated_gib", mem.get("host_max_rss_gib"))


MIN_ISOLATED_CALLS = 10  # fewer timed calls per op than this: no verdict from their ratio


def isolated_noisy(base: dict | None, row: dict | None) -> bool:
    """An isolated speedup is noise when either side has few timed calls or their min-max ranges overlap."""
    if not base or not row:
        return True
    if min(base.get("calls") or 0, row.get("calls") or 0) < MIN_ISOLATED_CALLS:
        return True
    (b0, b1), (r0, r1) = base.get("device_range_ms") or (None, None), row.get("device_range_ms") or (None, None)
    if None in (b0, b1, r0, r1):
        return True
    return b0 <= r1 and r0 <= b1


def analyse(config: Config, iso: list[dict], link, cpu_link) -> None:
    """Fill every row's analysis: parts, speedups vs the baseline, prediction, Amdahl, verdict."""
    for row in config.rows:
        row.a = analyse_row(row.run, row.W, for_world(link if row.run.on_gpu else cpu_link, row.W))
        row.a["isolated_rows"] = isolated_for(iso, config.key, row.W, config.strategy)
        row.a["isolated_call_ms"] = {op: r["device_ms"] for op, r in row.a["isolated_rows"].items()}
        config.notes += [n for n in (f"W={row.W}: {x}" for x in row.a["notes"]) if n not in config.notes]
    base1 = config.baseline.a if config.baseline else None
    for row in config.rows:
        a = row.a
        if base1 is None:
            a["verdict"] = _verdict(a, None)
            continue
        base = per_work(base1, a)  # the W=1 step for this row's samples a step
        a["work_factor"] = base.get("work_factor", 1.0)
        p = a["prediction"]
        a["speedup"] = {"step": ratio(base["step_ms"], a["step_ms"]),
                        "projected_step": ratio(base["step_ms"], a["projected_step_ms"]),
                        # the prediction's bounds: nothing overlapped .. everything overlapped
                        "bounds": [ratio(base["step_ms"], p["upper_ms"]), ratio(base["step_ms"], p["lower_ms"])],
                        # a simulated loop lacks the communication the projected step adds: no loop speedup
                        "loop": None if a["simulated"] else ratio(base["loop_ms"], a["loop_ms"])}
        a["noise"] = noise(base, a)
        a["speedup_instep"] = {op: ratio(base["regions_ms"][op], a["regions_ms"][op]) for op in OPS}
        a["speedup_isolated"] = {op: ratio(base["isolated_call_ms"].get(op), a["isolated_call_ms"].get(op))
                                 for op in OPS}
        a["isolated_noisy"] = {op: isolated_noisy(base["isolated_rows"].get(op), a["isolated_rows"].get(op))
                               for op in OPS if a["speedup_isolated"][op]}
        a["speedup_parts"] = {p: ratio(base["parts_ms"][p], a["parts_ms"][p]) for p in COMPUTE}
        # Amdahl: the W=1 compute parts, each divided by its own measured speedup (= the part at W).
        compute_w = sum(base["parts_ms"][p] / s for p in COMPUTE if (s := a["speedup_parts"][p]))
        compute_w += sum(a["parts_ms"][p] for p in COMPUTE if not a["speedup_parts"][p])  # zero at W=1
        measured = a["projected_step_ms"]
        resid = measured - compute_w
        comm = a["parts_ms"]["comm_kv"] + a["parts_ms"]["comm_grad"]
        named = {"comm": comm, "host": a["parts_ms"]["idle"], "sync": max(0.0, resid - comm - a["parts_ms"]["idle"])}
        # What the isolated microbenchmarks predict: ops at their isolated speedup, the rest ideal (1/W).
        iso_pred = None
        if all(a["speedup_isolated"][op] for op in OPS):
            iso_pred = (sum(base["parts_ms"][op] / a["speedup_isolated"][op] for op in OPS)
                        + base["parts_ms"]["other"] / row.W + comm)
        a["amdahl"] = {
            "compute_ms": compute_w,
            "predicted_speedup": ratio(base["step_ms"], compute_w),
            "measured_speedup": ratio(base["step_ms"], measured),
            "residual_ms": resid,
            "residual": named,
            "residual_named": max(named, key=named.get) if resid > 0 and max(named.values()) > 0 else None,
            "isolated_predicted_speedup": ratio(base["step_ms"], iso_pred),
            "ideal_speedup": row.W,
        }
        a["verdict"] = _verdict(a, base)


def _verdict(a: dict, base: dict | None) -> str:
    """Plain-language reading of one row, computed from its numbers; never stronger than its noise allows."""
    W, out = a["W"], []
    if base is None:
        out.append(f"W={W}: step {a['step_ms']:.3g} ms; no W=1 baseline, so no speedup")
    elif W == 1 and a is base:
        top = max(COMPUTE, key=lambda p: a["parts_ms"][p])
        out.append(f"baseline: {PART_LABEL[top]} is the largest part ({a['shares'][top]:.0%} of the step)")
    elif W == 1:  # the strategy at world size 1: its overhead over plain attention
        out.append(f"W=1 under cp {a['cp']}: step {1 / a['speedup']['step']:.2f}x the baseline's (CP overhead)")
    else:
        s, n = a["speedup"]["projected_step"], a["noise"]
        eff = s / W
        ideal_ms = base["step_ms"] / W
        if n["noisy"]:
            kind = (f"not conclusive: noisy (step spread {n['spread_ms']:.3g} ms {n['kind']} > the "
                    f"{n['diff_ms']:.3g} ms difference)")
        elif eff > 1.1:  # superlinear only when the gap to the ideal step is larger than the spread
            beyond = ideal_ms - a["projected_step_ms"]
            kind = ("superlinear (check caches, host effects)" if n["spread_ms"] is None or beyond > n["spread_ms"]
                    else "ideal within noise")
        else:
            kind = "scales well" if eff >= 0.8 else "scales partly" if eff >= 0.5 else "does not pay"
        sim = ""
        if a["simulated"]:
            sim = (" (simulated, comm not priced)" if a["prediction"]["link"] is None else
                   f" (simulated, comm predicted with {a['prediction']['link']})")
        lo, hi = a["speedup"]["bounds"]
        bounds = f", bounds {lo:.2f}-{hi:.2f}x" if a["simulated"] and lo and hi and hi > lo else ""
        f = base.get("work_factor", 1)
        what = "step speedup" if f == 1 else (
            f"samples/s ({a['samples_per_step']:g} samples a step against {base['step_ms'] / f:.3g} ms for one at W=1)")
        out.append(f"W={W}{sim}: {s:.2f}x {what} ({eff:.0%} of ideal{bounds}; {a['timer']} steps): {kind}")
        sdpa = None
        if None not in (base["regions_ms"]["sdpa_fwd"], base["regions_ms"]["sdpa_bwd"], a["regions_ms"]["sdpa_fwd"],
                        a["regions_ms"]["sdpa_bwd"]):
            sdpa = ratio(base["regions_ms"]["sdpa_fwd"] + base["regions_ms"]["sdpa_bwd"],
                          a["regions_ms"]["sdpa_fwd"] + a["regions_ms"]["sdpa_bwd"])
        other = a["speedup_parts"]["other"]
        if sdpa is not None and other and other > sdpa * 1.2 and s > 1.1 and not n["noisy"]:
            out.append(f"the gain comes from the non-attention compute (other compute {other:.2f}x, "
                       f"{base['shares']['other']:.0%} of the W=1 step) more than from attention ({sdpa:.2f}x)")
        iso = a["amdahl"]["isolated_predicted_speedup"]
        if iso is not None:
            out.append(f"isolated op speedups with the rest ideal predict {iso:.2f}x")
    if a["idle_frac"] is not None and a["idle_frac"] >= 0.2:
        out.append(f"host bound at W={W}: device idle {a['idle_frac']:.0%} of the step")
    if a["loop_ms"] and a["loop_ms"] > 1.1 * a["step_ms"]:
        out.append(f"the loop is slower than the step: {a['loop_ms']:.3g} ms per iteration for a "
                   f"{a['step_ms']:.3g} ms step (host time between steps: data loading, hooks)")
    comm = a["parts_ms"]["comm_kv"] + a["parts_ms"]["comm_grad"]
    total = sum(a["parts_ms"].values())
    if W > 1 and total and comm / total >= 0.1:
        est = "" if a["comm_source"].startswith("measured") else " (predicted)"
        out.append(f"exposed communication {comm / total:.0%} of the step{est}: K/V exchange "
                   f"{a['parts_ms']['comm_kv']:.3g} ms, gradient sync {a['parts_ms']['comm_grad']:.3g} ms")
    if a["idle_frac"] is None and W > 1 and a["timer"] == "CUDA events":
        out.append("device idle not recorded: host-bound time is counted as other compute")
    return "; ".join(out)


# ---------------------------------------------------------------- the report object


@dataclass
class Report:
    root: Path
    link: LinkProfile | dict  # GPU runs' profile (or one per group size: {W: profile})
    cpu_link: LinkProfile | dict | None  # CPU runs' (measured gloo) profile(s), or None: CPU comm not priced
    configs: list[Config]
    runs: list[Run]
    skipped: list[Skipped]
    iso: list[dict]
    reconcile: dict | None = None  # reconcile.reconcile()'s section
    harness: dict | None = None  # harness_overhead(): Lightning rows against their bare twins
    regimes: dict | None = None  # regimes.regimes(): the user's W >= 2 runs against every W=1 baseline kind
    levers: dict | None = None  # levers.levers(): pairs of runs of one call that differ in one lever's settings
    plans: list | None = None  # scripts/plan.py's cells found under the root (their plan.json), ranked rows each
    across: tuple = ()  # settings compared across (scripts/report.py --across): left out of the configurations' keys
    headline: dict | None = None  # headline.headline(): the verdicts the report opens with
    efficiency: list | None = None  # efficiency.efficiency(): each profiled GPU run's MFU by part and kernel

    def to_dict(self) -> dict:
        return {
            "root": str(self.root), "link": _link_dict(self.link), "cpu_link": _link_dict(self.cpu_link),
            "headline": self.headline,
            "configurations": [{"id": c.id, "title": c.title, "key": c.key, "strategy": c.strategy, "notes": c.notes,
                                "rows": [{"baseline": r.baseline, **r.a} for r in c.rows]} for c in self.configs],
            "reconcile": self.reconcile,
            "harness": self.harness,
            "regimes": (self.regimes or {}).get("cells", []),
            "regime_summary": (self.regimes or {}).get("summary", {}),
            "regime_unpaired": (self.regimes or {}).get("unpaired", []),
            "regime_notes": (self.regimes or {}).get("notes", []),
            "regime_across_devices": (self.regimes or {}).get("across_devices", []),
            "levers": (self.levers or {}).get("rows", []),
            "lever_notes": (self.levers or {}).get("notes", []),
            "plans": self.plans or [],
            "efficiency": self.efficiency or [],
            "isolated": self.iso,
            "skipped": [{"path": str(s.path), "status": s.status, "reason": s.reason} for s in self.skipped],
        }


def _link_dict(link):
    if isinstance(link, dict):
        return {str(w): p.to_dict() for w, p in link.items()}
    return link and link.to_dict()
