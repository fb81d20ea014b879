"""Harness overhead: each Lightning run's step against its bare twin's (runs.twin_key: the same step, no
Lightning), the issue's bound 3% at every W; pairs repeated over data seeds, pooled; twins interleaved inside one
run (--interleave-bare)."""

import json
import statistics

from flux_cp.runs.results import pooled_overhead, pooled_runs_overhead

from .runs import Config, Run, _latest, noise, ratio, strategy_label, twin_key

HARNESS_TARGET_PCT = 3.0  # the bound on Lightning's step over the bare loop's, at every W


def _step_side(run: Run) -> dict:
    """A run's step median and spread, as noise() reads them (measured steps only: no comm projected)."""
    spread, kind = run.spread("step_ms")
    step = run.metric("step_ms")
    return {"step_ms": step, "projected_step_ms": step, "step_spread_ms": spread, "step_spread_kind": kind}


def _pct_over(a, b):
    return None if (r := ratio(a, b)) is None else 100 * (r - 1)


HOST_CHANGE = 1.15  # host speeds further apart than this within a pair: the host, not the harness, moved the step


def _host_speeds(d: dict) -> list[float]:
    return [x for x in (d["env"].get("host_op_us"), d.get("host_op_us_end")) if x]


def _host_changed(speeds: list[float]) -> bool:
    return len(speeds) >= 2 and max(speeds) > HOST_CHANGE * min(speeds)


def _twin(lit: Run, twins: list[Run]) -> tuple[Run, list[Run]]:
    """(the bare twin, the others): the latest of those run beside the Lightning run (its suite's folder), else the
    latest of all: a later suite's bare run of the same settings ran on another host's mood, not as its pair."""
    beside = [r for r in twins if r.path.parent.parent == lit.path.parent.parent]  # path: the summary.json
    twin = _latest(beside or twins)[0]
    return twin, [r for r in twins if r is not twin]


def harness_overhead(configs: list[Config], runs: list[Run]) -> dict:
    """Each Lightning row's step against its bare twin's (the latest bare run with its twin_key), once per run
    (the W=1 baseline is every strategy's row); bare runs matched to no row are listed."""
    bare: dict[str, list[Run]] = {}
    for r in runs:
        if r.d["mode"] == "train" and r.harness == "bare":
            bare.setdefault(twin_key(r.d), []).append(r)
    rows, by_run, used = [], {}, set()
    for c in configs:
        for row in c.rows:
            lit = row.run
            if lit.harness != "lightning" or not (twins := bare.get(twin_key(lit.d))):
                continue
            if lit.path in by_run:
                by_run[lit.path]["configs"].append(c.id)
                continue
            twin, dup = _twin(lit, twins)
            used.update(r.path for r in twins)
            n = noise(_step_side(twin), _step_side(lit))
            pct = _pct_over(lit.metric("step_ms"), twin.metric("step_ms"))
            by_run[lit.path] = {
                "configs": [c.id], "strategy": c.strategy, "W": row.W, "lightning_run": str(lit.path),
                "bare_run": str(twin.path), "other_bare_runs": len(dup),
                "lightning_step_ms": lit.metric("step_ms"), "bare_step_ms": twin.metric("step_ms"),
                "overhead_pct": pct, "noise": n, "noisy": n["noisy"],
                "within_target": pct is not None and abs(pct) <= HARNESS_TARGET_PCT,  # faster is no better: a bias
                # the loop's period (data and hooks between steps too), where both record it
                "lightning_loop_ms": lit.metric("loop_ms"), "bare_loop_ms": twin.metric("loop_ms"),
                "loop_overhead_pct": _pct_over(lit.metric("loop_ms"), twin.metric("loop_ms")),
                # the host's speed at each run's start and end (us per tiny op): a pair is only comparable on one
                "host_op_us": (hosts := {"lightning": _host_speeds(lit.d), "bare": _host_speeds(twin.d)}),
                "host_changed": _host_changed(hosts["lightning"] + hosts["bare"]),
            }
            rows.append(by_run[lit.path])
    unmatched = sorted(({"run": r.name, "path": str(r.path), "W": r.W} for rs in bare.values() for r in rs
                        if r.path not in used), key=lambda x: x["path"])
    interleaved = harness_interleaved(runs)
    return {"target_pct": HARNESS_TARGET_PCT, "rows": rows, "unmatched_bare": unmatched,
            "repeats": harness_repeats(runs, bare), "interleaved": interleaved,
            "interleaved_pooled": harness_interleaved_pooled(interleaved, runs)}


def harness_interleaved(runs: list[Run]) -> list[dict]:
    """Lightning runs with a bare twin inside them (--interleave-bare: callbacks/twin.py): their steps and the twin's
    saw the same host within seconds, so their interval is the harness's, not the host's."""
    out = []
    for r in runs:
        tw = r.d.get("interleaved_bare") or {}
        if r.d["mode"] == "train" and "ci95_pct" in tw:
            out.append({"run": str(r.path), "strategy": strategy_label(r.d), "W": r.W, "every": tw["every"],
                        "steps": [tw["lightning_steps"], tw["steps"]], "overhead_pct": tw["overhead_pct"],
                        "ci95_pct": tw["ci95_pct"], "verdict": _pooled_verdict(tw["ci95_pct"])})
    return sorted(out, key=lambda x: (x["strategy"], x["W"], x["run"]))


def harness_interleaved_pooled(rows: list[dict], runs: list[Run]) -> list[dict]:
    """The interleaved runs of one configuration and W over data seeds (configs/suites/flux_harness_user.yaml: five a
    W), pooled: one run's interval is its own steps'; the seeds' pooled interval is what resolves a few %."""
    by_path = {str(r.path): r for r in runs}
    groups: dict[tuple, list] = {}
    for g in rows:
        r = by_path[g["run"]]
        lit, twin = _measured_steps(r), r.d["interleaved_bare"]["step_ms"]
        if lit and twin:
            groups.setdefault((g["strategy"], g["W"], _unseeded_key(r.d)), []).append((lit, twin))
    out = []
    for (strategy, W, _), pairs in groups.items():
        if len(pairs) >= 2:
            est, ci = pooled_runs_overhead(pairs)
            out.append({"strategy": strategy, "W": W, "runs": len(pairs), "overhead_pct": est, "ci95_pct": ci,
                        "verdict": _pooled_verdict(ci)})
    return sorted(out, key=lambda x: (x["strategy"], x["W"]))


def _unseeded_key(d: dict) -> str:
    """A run's twin key with its data seed left out: the runs a group of seeds repeats."""
    unseeded = json.loads(twin_key(d))  # [mode, device, model, data, run]
    unseeded[3] = {k: v for k, v in unseeded[3].items() if k != "seed"}
    return json.dumps(unseeded, sort_keys=True)


def _measured_steps(run: Run) -> list[float]:
    """The run's measured step_ms values (summary.json per_step: plain steps; the others are None)."""
    return [x for x in (run.d.get("per_step") or {}).get("step_ms", []) if x is not None]


def _pooled_verdict(ci: list[float]) -> str:
    """Against the target, from the interval: a verdict only where the steps' spread resolves it."""
    t = HARNESS_TARGET_PCT
    if -t <= ci[0] and ci[1] <= t:
        return "within"
    if ci[0] > t:
        return "over"
    if ci[1] < -t:
        return "faster (a bias)"
    return "not resolved"


def harness_repeats(runs: list[Run], bare: dict[str, list[Run]]) -> list[dict]:
    """Pairs of one configuration and W repeated with other data seeds (configs/suites/flux_harness_twin.yaml):
    every Lightning run with a bare twin of its own seed, grouped over the seeds; the median overhead of a group and
    its range. One pair cannot show a few % where steps move ~15% run to run; several interleaved pairs can, and so
    can every measured step of the group pooled per harness, with a bootstrap interval (`pooled_*`)."""
    groups: dict[tuple, list] = {}
    for r in runs:
        if r.d["mode"] != "train" or r.harness != "lightning" or not (twins := bare.get(twin_key(r.d))):
            continue
        twin = _twin(r, twins)[0]
        pct = _pct_over(r.metric("step_ms"), twin.metric("step_ms"))
        key = (strategy_label(r.d), r.W, _unseeded_key(r.d))
        if pct is not None:
            groups.setdefault(key, []).append((pct, _measured_steps(r), _measured_steps(twin)))
    out = []
    for (strategy, W, _), pairs in groups.items():
        if len(pairs) < 2:
            continue
        pcts = [p for p, _, _ in pairs]
        g = {"strategy": strategy, "W": W, "pairs": len(pairs), "overhead_pct_median": statistics.median(pcts),
             "overhead_pct_range": [min(pcts), max(pcts)],
             "within_target": abs(statistics.median(pcts)) <= HARNESS_TARGET_PCT}
        lit, twin = [x for _, ls, _ in pairs for x in ls], [x for _, _, bs in pairs for x in bs]
        if lit and twin:
            est, ci = pooled_overhead(lit, twin)
            g |= {"pooled_steps": [len(lit), len(twin)], "pooled_overhead_pct": est, "pooled_ci95_pct": ci,
                  "pooled_verdict": _pooled_verdict(ci)}
        out.append(g)
    return out
