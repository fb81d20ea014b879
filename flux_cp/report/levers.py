"""Levers: what one setting changed, measured in one call.

Issue 26 asks each lever measured before and after on the H200. A suite that runs a setting both ways (the
all-to-alls under the MLP or not, max-autotune or not, q/k/v in one all-to-all or three) is that A/B: every pair of
train runs in one suite's folder (one call: one host, one device, one code version) whose settings differ only in
one lever's, at the same W and harness, is a row: the rank's measured step and the predicted step (its collectives
priced, analysis.analyse_row) both ways. The lever's default value is the "before"; each other value an "after".
Runs repeated in the folder: their median run (regimes._median_run). Pairs across folders are not made: another
call ran on another host's mood (runs.py), and maybe other code. --contention is one (a simulated rank computing
beside its collectives' traffic, parallel/contention.py): the recipes' predicted steps with and without the SMs and
memory NCCL's kernels would take from the compute they overlap.
"""

import json

from flux_cp.config import RunConfig
from flux_cp.predict.links import for_world

from .analysis import analyse_row
from .runs import BOOKKEEPING, Run, _first_line, harness, strategy_label

# lever -> the run settings it moves (together: zero2_gather's forward share means nothing without it)
LEVERS = {
    "all-to-alls under the MLP": ("ulysses_overlap",),
    "q, k, v in one all-to-all": ("ulysses_qkv",),
    "ZeRO-2 gathers under the forward": ("zero2_gather", "zero2_forward_share"),
    "ZeRO-2 bucket size": ("zero2_bucket_mb",),
    "gradients as DDP's bucket views": ("grad_bucket_view",),
    "ZeRO in one flat buffer": ("zero_bucket_view",),
    "split conditioning": ("split_conditioning",),
    "compile mode": ("compile_mode",),
    "compile": ("compile",),
    "step graph": ("step_graph",),
    "weights": ("weights",),
    "SDPA backend": ("sdpa_backend",),
    # a simulated rank computing beside its collectives' traffic (--contention): the cost of sharing the GPU with NCCL
    "traffic beside the compute": ("contention", "contention_ctas"),
}
_DEFAULT = RunConfig()


def _settings(run: Run) -> dict:
    """The run's settings, each missing one (a summary older than the setting) at its default."""
    return {k: v for k, v in vars(_DEFAULT).items() if not k.startswith("_")} | run.d["config"]["run"]


def _rest_key(run: Run, keys: tuple) -> str:
    """What a pair shares: its suite's folder, mode, device, model, data, W, harness and every run setting but
    bookkeeping and the lever's."""
    d, s = run.d, _settings(run)
    rest = {k: v for k, v in s.items() if k not in BOOKKEEPING and k not in keys}
    return json.dumps([str(run.path.parent.parent), d["mode"], d["env"]["device"], d["config"]["model"],
                       d["config"]["data"], run.W, harness(d), rest], sort_keys=True, default=str)


def levers(report) -> dict:
    """{"rows": [...], "notes": [...]}: every lever's pairs among the report's train runs."""
    from .regimes import _median_run, compile_label  # regimes imports analysis, as this module does: no cycle

    train = [r for r in report.runs if r.d["mode"] == "train"]
    cache: dict[str, dict] = {}
    notes: list[str] = []

    def analysed(run: Run) -> dict | None:
        if str(run.path) not in cache:
            link = report.link if run.on_gpu else report.cpu_link
            try:
                cache[str(run.path)] = analyse_row(run, run.W, for_world(link, run.W) if run.W > 1 else None)
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
                notes.append(f"{run.name}: not analysed ({type(e).__name__}: {_first_line(e)})")
                cache[str(run.path)] = None
        return cache[str(run.path)]

    rows = []
    for lever, keys in LEVERS.items():
        default = tuple(getattr(_DEFAULT, k) for k in keys)
        groups: dict[str, dict[tuple, list[Run]]] = {}
        for r in train:
            s = _settings(r)
            groups.setdefault(_rest_key(r, keys), {}).setdefault(tuple(s[k] for k in keys), []).append(r)
        for by_value in groups.values():
            if len(by_value) < 2:
                continue
            base_value = default if default in by_value else sorted(by_value, key=str)[0]
            base, _ = _median_run(by_value[base_value])
            a0 = analysed(base)
            for value, runs in sorted(by_value.items(), key=lambda x: str(x[0])):
                if value == base_value:
                    continue
                run, _ = _median_run(runs)
                a1 = analysed(run)
                if a0 is None or a1 is None:
                    continue
                before, after = a0["projected_step_ms"], a1["projected_step_ms"]
                rows.append({
                    "lever": lever, "settings": list(keys), "before": _value(base_value), "after": _value(value),
                    "W": run.W, "strategy": strategy_label(base.d), "harness": harness(base.d),
                    "build": _build(base, compile_label), "suite": _suite(report.root, base),
                    "before_run": base.name, "after_run": run.name,
                    "step_ms": [base.metric("step_ms"), run.metric("step_ms")],
                    "predicted_step_ms": [before, after],
                    "exposed_comm_ms": [_exposed(a0), _exposed(a1)],  # the collectives' share of each prediction
                    "change_pct": None if not before or after is None else 100 * (after / before - 1),
                    "basis": "predicted" if a1["collectives"] == "fake" else "measured",
                    "peak_gib": [a0.get("peak_gib"), a1.get("peak_gib")],
                })
    order = list(LEVERS)
    rows.sort(key=lambda x: (order.index(x["lever"]), x["strategy"], x["build"], x["W"], x["suite"], str(x["after"])))
    return {"rows": rows, "notes": notes}


def _build(run: Run, compile_label) -> str:
    """How the base run's step was built: eager or compiled (mode), and under the step graph or not."""
    return compile_label(_settings(run))


def _suite(root, run: Run) -> str:
    """The pair's folder, relative to the report's root where it lies under it (two calls' suites may share a name)."""
    folder = run.path.parent.parent
    try:
        return str(folder.relative_to(root))
    except ValueError:
        return str(folder)


def _exposed(a: dict) -> float | None:
    """The communication a prediction leaves exposed (none at W=1, or measured inside a real multi-rank step)."""
    return (a.get("prediction") or {}).get("exposed_ms")


def _value(v: tuple):
    return v[0] if len(v) == 1 else list(v)
