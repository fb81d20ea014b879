"""Bare-loop runs (--harness bare) in the report and the end-of-run verdict: built from real CPU summaries
(docs/archive) with the step times set, a Lightning run and its bare twin at W=1 and W=2 plus a bare run with no
twin. Bare runs never join a Lightning configuration; each Lightning row is held against its twin."""

import copy
import json
import os
import statistics
import tarfile

import pytest

from flux_cp.report import build, verdict_lines
from flux_cp.report import write as write_report
from flux_cp.report.runs import twin_key
from flux_cp.runs.results import stats
from flux_cp.runs.verdict import verdict

from .conftest import ROOT
from .test_report import assert_narrow

TEMPLATES = ROOT / "docs" / "archive" / "2026-12-03-cpu-prediction" / "runs.tar.xz"  # runs/<name>/summary.json
W1, W2 = "w1-none-r0", "real-w2-allgather-kv-ddp-r0"
NEW_KEYS = {"loader": "device", "sigterm_every": 100}  # run settings summaries gained with --harness
# per measured step, ms: the bare W=1 loop is noisy (IQR 8.5 ms > the 2 ms difference), W=2 steady
STEPS = {"lit-w1": [100.0] * 8, "bare-w1": [90, 94, 96, 98, 98, 100, 104, 110], "lit-w2": [60.0] * 8,
         "bare-w2": [55.0] * 8, "bare-w2-ulysses": [50.0] * 8}


def summary(template: str, name: str, harness: str | None, **run) -> dict:
    """A real summary with its step times replaced; a bare run as the bare loop writes one: whole steps only."""
    with tarfile.open(TEMPLATES) as tar:
        d = json.load(tar.extractfile(f"runs/{template}/summary.json"))
    d["run_name"], d["per_step"]["step_ms"], d["metrics"]["step_ms"] = name, STEPS[name], stats(STEPS[name])
    if harness is not None:  # older summaries have neither key: they are Lightning runs
        d["harness"] = harness
        d["config"]["run"] |= {"harness": harness, **NEW_KEYS}
    if harness == "bare":
        keep = ("step_ms", "host_ms", "loop_ms") if name == "bare-w2" else ("step_ms", "host_ms")
        d["metrics"] = {k: v for k, v in d["metrics"].items() if k in keep}
        d["per_step"] = {k: v for k, v in d["per_step"].items() if k in keep}
        # bookkeeping differs from the twin's: still its twin
        d["config"]["run"] |= {"output": f"runs/{name}", "group": "bare", "steps": 30}
    d["config"]["run"] |= run
    d["cp"] = d["config"]["run"]["cp"]  # the resolved strategy, as the summary's header has it
    return d


def med(name: str) -> float:
    return stats(STEPS[name])["median"]


def put(root, name: str, d: dict, age: int):
    """root/name/summary.json, `age` seconds old: a larger age is older (the report takes the latest)."""
    p = root / name / "summary.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(d))
    t = 2_000_000_000 - age
    os.utime(p, (t, t))
    return p


def lightning_runs(root):
    put(root, "lit-w1", summary(W1, "lit-w1", None), age=100)  # an older summary: no harness keys
    put(root, "lit-w2", summary(W2, "lit-w2", "lightning"), age=90)


def bare_runs(root):
    # newer than the Lightning runs: were they mixed, the latest W=1 baseline and W=2 row would be these
    put(root, "bare-w1", summary(W1, "bare-w1", "bare"), age=10)
    put(root, "bare-w2", summary(W2, "bare-w2", "bare"), age=9)
    put(root, "bare-w2-ulysses", summary(W2, "bare-w2-ulysses", "bare", cp="ulysses", ulysses_qkv="fused"), age=8)


def lightning_configs(rep: dict) -> list[dict]:
    return [{k: v for k, v in c.items() if k != "id"} for c in rep["configurations"]
            if c["key"].get("harness", "lightning") == "lightning"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The report on the Lightning runs alone, then with the bare runs added (same folder, same paths)."""
    root = tmp_path_factory.mktemp("runs")
    lightning_runs(root)
    alone = json.loads(json.dumps(build(root, user="allgather-kv").to_dict()))
    bare_runs(root)
    report = build(root, user="allgather-kv")
    paths = write_report(report, root / "report")
    return {"root": root, "alone": alone, "report": report, "json": json.loads(paths["json"].read_text()),
            "md": paths["md"].read_text(), "html": paths["html"].read_text()}


def test_overhead_is_the_ratio_of_the_twins_steps(built):
    h = built["json"]["harness"]
    assert h["target_pct"] == 3.0
    rows = {r["W"]: r for r in h["rows"]}
    assert sorted(rows) == [1, 2]
    for w in (1, 2):
        r = rows[w]
        assert r["lightning_run"] == str(built["root"] / f"lit-w{w}" / "summary.json")
        assert r["bare_run"] == str(built["root"] / f"bare-w{w}" / "summary.json")
        assert r["lightning_step_ms"] == med(f"lit-w{w}") and r["bare_step_ms"] == med(f"bare-w{w}")
        assert r["overhead_pct"] == pytest.approx(100 * (med(f"lit-w{w}") / med(f"bare-w{w}") - 1), rel=1e-12)
    # W=1: 100 / 98 ms, +2.0%, under 3% but the bare loop's IQR (8.5 ms) is wider than the 2 ms difference
    assert rows[1]["within_target"] and rows[1]["noisy"] and rows[1]["noise"]["kind"] == "IQR"
    q = statistics.quantiles(STEPS["bare-w1"], n=4)
    assert rows[1]["noise"]["spread_ms"] == pytest.approx(q[2] - q[0]) and rows[1]["loop_overhead_pct"] is None
    # W=2: 60 / 55 ms, +9.1%, over 3%, steady steps; both record the loop
    assert not rows[2]["within_target"] and not rows[2]["noisy"]
    t = built["report"].runs
    loops = {r.name: r.metric("loop_ms") for r in t}
    assert rows[2]["loop_overhead_pct"] == pytest.approx(100 * (loops["lit-w2"] / loops["bare-w2"] - 1))
    # the run with no Lightning twin (ulysses) is listed, not dropped
    (u,) = h["unmatched_bare"]
    assert u["run"] == "bare-w2-ulysses" and u["W"] == 2


def test_bare_runs_leave_the_lightning_rows_alone(built):
    after = lightning_configs(built["json"])
    assert after == lightning_configs(built["alone"]) and len(after) == 1
    (c,) = after
    base, row = c["rows"]
    assert base["baseline"] and base["run"] == "lit-w1" and row["run"] == "lit-w2"
    assert row["speedup"]["step"] == pytest.approx(med("lit-w1") / med("lit-w2"), rel=1e-12)
    assert built["json"]["reconcile"] == built["alone"]["reconcile"] is not None  # no bare alternative either
    assert not any("bare" in a["strategy"] for a in built["json"]["reconcile"]["alternatives"])


def test_bare_runs_are_their_own_configurations(built):
    bare = {c["strategy"]: c for c in built["json"]["configurations"] if c["key"]["harness"] == "bare"}
    assert set(bare) == {"allgather-kv bare", "ulysses bare"}
    base, row = bare["allgather-kv bare"]["rows"]
    assert base["baseline"] and base["run"] == "bare-w1" and row["run"] == "bare-w2"
    assert row["speedup"]["step"] == pytest.approx(med("bare-w1") / med("bare-w2"), rel=1e-12)
    assert [r["run"] for r in bare["ulysses bare"]["rows"]] == ["bare-w1", "bare-w2-ulysses"]


def test_markdown_and_html_carry_the_table(built):
    md = built["md"]
    assert "## Harness overhead against the bare loop" in md
    # two tables, rows tied by #: the overheads (strategy, W, steps, overhead, spread, target), then the runs
    section = md[md.index("## Harness overhead"):md.index("\n## ", md.index("## Harness overhead"))]
    rows = [ln.split(" | ") for ln in section.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    steps = {r[0]: r for r in rows if len(r) == 8}
    runs = {r[0]: r for r in rows if len(r) == 5}
    assert len(steps) == len(runs) == 2
    w1, w2 = sorted(steps.values(), key=lambda r: r[2])
    assert f"{100 * (med('lit-w1') / med('bare-w1') - 1):+.1f}%" in w1 and "within 3% (noisy: not significant)" in w1[7]
    assert f"{100 * (med('lit-w2') / med('bare-w2') - 1):+.1f}%" in w2 and w2[7] == "over 3% |"
    for r in (w1, w2):  # the same # in the runs table: the twins' paths and the configurations' anchors
        lit, bare = runs[r[0]][3], runs[r[0]][4].rstrip(" |")
        assert lit == f"lit-w{r[2]}/summary.json" and bare == f"bare-w{r[2]}/summary.json"
        assert runs[r[0]][1].startswith("[c") and "](#c" in runs[r[0]][1]
    assert "Bare runs with no Lightning twin among the rows (1): bare-w2-ulysses/summary.json (W=2)" in md
    assert "<h2>Harness overhead against the bare loop</h2>" in built["html"]
    assert_narrow(md, built["html"])  # the 11 columns in two tables; report.json keeps each row whole
    for r in built["json"]["harness"]["rows"]:
        assert {"configs", "strategy", "W", "lightning_step_ms", "bare_step_ms", "overhead_pct", "noise",
                "within_target", "noisy", "loop_overhead_pct", "lightning_run", "bare_run"} <= set(r)
    printed = [ln for ln in verdict_lines(built["report"]) if ln.startswith("harness ")]
    assert len(printed) == 2 and "over 3%" in printed[1]


def test_no_section_without_bare_runs(built):
    assert built["alone"]["harness"]["rows"] == [] and built["alone"]["harness"]["unmatched_bare"] == []
    root = built["root"].parent / "lightning-only"
    lightning_runs(root)
    write_report(build(root), root / "report")
    assert "Harness overhead" not in (root / "report" / "report.md").read_text()


@pytest.mark.parametrize("change", [{"harness": "bare"}, {"loader": "workers", "num_workers": 4}, {"steps": 99},
                                    {"sigterm_every": 1}, {"output": "x"}, {"timing": False}, {"gc_every": 5}])
def test_twin_ignores_bookkeeping(change):
    d = summary(W2, "lit-w2", "lightning")
    b = copy.deepcopy(d)
    b["config"]["run"] |= change
    assert twin_key(b) == twin_key(d)


@pytest.mark.parametrize("section,change", [("run", {"rotate": "alltoall"}), ("run", {"precision": "64-true"}),
                                            ("run", {"simulate_world": 2}), ("run", {"cp_degree": 1}),
                                            ("run", {"compile": True}), ("run", {"split_conditioning": True}),
                                            ("model", {"num_heads": 8}), ("data", {"batch_size": 2})])
def test_twin_needs_the_same_step(section, change):
    d = summary(W2, "lit-w2", "lightning")
    b = copy.deepcopy(d)
    b["config"][section] |= change
    assert twin_key(b) != twin_key(d)


def test_verdict_baseline_of_the_same_harness(tmp_path):
    lit1 = put(tmp_path, "lit-w1", summary(W1, "lit-w1", None), age=100).parent
    lit2 = summary(W2, "lit-w2", "lightning")
    bare2 = summary(W2, "bare-w2", "bare")
    # only a Lightning baseline: the bare run falls back to it, and says so
    line, nxt = verdict(bare2, tmp_path / "x", [tmp_path])
    assert f"{med('lit-w1') / med('bare-w2'):.2f}x vs {lit1} (W=1)" in line
    assert "a lightning run: no bare W=1 baseline yet" in line
    bare1 = put(tmp_path, "bare-w1", summary(W1, "bare-w1", "bare"), age=1).parent  # the newest W=1 run
    line, _ = verdict(bare2, tmp_path / "x", [tmp_path])
    assert f"{med('bare-w1') / med('bare-w2'):.2f}x vs {bare1} (W=1)" in line and "no bare" not in line
    line, _ = verdict(lit2, tmp_path / "x", [tmp_path])  # newer, but bare: not the Lightning run's baseline
    assert f"{med('lit-w1') / med('lit-w2'):.2f}x vs {lit1} (W=1)" in line and "a bare run" not in line
    line, nxt = verdict(bare2, tmp_path / "x", [tmp_path / "none"])
    assert "no W=1 baseline" in line and "--harness bare --devices 1 --cp none" in nxt


def test_verdict_refuses_a_speedup_above_w_and_prefers_a_steady_baseline(tmp_path):
    """A cold machine's W=1 run (steps 1146-1645 ms) made a W=2 run read '41.29x': never stated as an answer. The
    baseline is chosen among steady runs first (slowest step within 1.4x the fastest), even when an unsteady one is
    newer; with only the unsteady one the line says the baseline is suspect and the next command redoes it."""
    lit2 = summary(W2, "lit-w2", "lightning")
    cold = summary(W1, "lit-w1", "lightning")
    cold["per_step"]["step_ms"] = steps = [1146.0, 1645.0, 1500.0, 1400.0]
    cold["metrics"]["step_ms"] = stats(steps)
    cold_dir = put(tmp_path, "cold", cold, age=1).parent
    line, nxt = verdict(lit2, tmp_path / "x", [tmp_path])
    assert "would beat W=2 GPUs, which CP cannot: that baseline is suspect (its steps 1146-1645 ms)" in line
    assert f"against {cold_dir} (W=1)" in line and "x vs " not in line
    assert nxt.startswith("next: python scripts/train_bench.py") and "--cp none" in nxt
    steady = put(tmp_path, "steady", summary(W1, "lit-w1", "lightning"), age=100).parent  # older, steady
    line, _ = verdict(lit2, tmp_path / "x", [tmp_path])
    assert f"{med('lit-w1') / med('lit-w2'):.2f}x vs {steady} (W=1)" in line and "suspect" not in line


def test_repeated_pairs_give_the_median_overhead(tmp_path):
    """The same pair with other data seeds (flux_harness_twin.yaml): one line per configuration and W with the
    median overhead over the pairs and its range; a pair seen once forms no group."""
    w1 = [("lit-w1", None), ("bare-w1", "bare")]
    for name, h in w1:
        put(tmp_path, name, summary(W1, name, h), age=100)
    overheads = {}
    for seed, (lit_ms, bare_ms) in enumerate([(60.0, 55.0), (57.0, 56.0), (62.0, 50.0)]):
        for name, h, ms in (("lit-w2", "lightning", lit_ms), ("bare-w2", "bare", bare_ms)):
            d = summary(W2, name, h)
            d["config"]["data"]["seed"] = seed
            d["per_step"]["step_ms"] = [ms] * 8
            d["metrics"]["step_ms"] = stats([ms] * 8)
            put(tmp_path, f"{name}-s{seed}", d, age=50 - seed)
        overheads[seed] = 100 * (lit_ms / bare_ms - 1)
    report = build(tmp_path, user="allgather-kv")
    h = json.loads(json.dumps(report.to_dict()))["harness"]
    (g,) = h["repeats"]  # W=1's single pair: no group
    assert (g["W"], g["pairs"]) == (2, 3)
    assert g["overhead_pct_median"] == pytest.approx(statistics.median(overheads.values()))
    assert g["overhead_pct_range"] == pytest.approx([min(overheads.values()), max(overheads.values())])
    assert g["within_target"] is False  # median +9.1%
    # every step pooled per harness: medians 60 (Lightning) and 55 (bare); the interval from resampled steps
    assert g["pooled_steps"] == [24, 24] and g["pooled_overhead_pct"] == pytest.approx(100 * (60 / 55 - 1))
    lo, hi = g["pooled_ci95_pct"]
    assert 100 * (57 / 56 - 1) - 1e-9 <= lo <= g["pooled_overhead_pct"] <= hi <= 100 * (62 / 50 - 1) + 1e-9
    md = write_report(report, tmp_path / "report")["md"].read_text()
    assert f"allgather-kv W=2: median {g['overhead_pct_median']:+.1f}% over 3 pairs" in md and "over 3%" in md
    assert f"all steps pooled (24 Lightning, 24 bare): {g['pooled_overhead_pct']:+.1f}%" in md


def test_pooled_steps_give_a_verdict_only_where_their_spread_resolves_it():
    """Within, over, faster, or not resolved: from the bootstrap interval of the pooled medians' ratio."""
    import random

    from flux_cp.report.harness import _pooled_verdict, pooled_overhead

    rng = random.Random(1)
    bare = [100 + rng.gauss(0, 0.5) for _ in range(120)]
    cases = {"within": 101.0, "over": 110.0, "faster (a bias)": 90.0}
    for want, centre in cases.items():
        est, ci = pooled_overhead([centre + rng.gauss(0, 0.5) for _ in range(65)], bare)
        assert ci[0] <= est <= ci[1] and _pooled_verdict(ci) == want, (want, est, ci)
    est, ci = pooled_overhead([101 + rng.gauss(0, 15) for _ in range(65)], bare)  # an H200's host-bound spread
    assert _pooled_verdict(ci) == "not resolved" and ci[1] - ci[0] > 6


def test_a_lightning_step_much_faster_than_its_twin_is_not_within_the_target():
    """-24.5% (an H200 pair at W=4): the harness cannot make the step faster, so such a pair is a bias or noise, not
    an overhead within 3%."""
    from flux_cp.report.render import _against_target

    row = {"overhead_pct": -24.5, "within_target": abs(-24.5) <= 3.0, "noisy": False}
    assert not row["within_target"] and _against_target(row, 3.0) == "faster by over 3%"
    assert _against_target({"overhead_pct": 2.0, "within_target": True, "noisy": True}, 3.0) == \
        "within 3% (noisy: not significant)"


def test_a_pair_whose_host_changed_speed_says_so():
    """The lent H200 hosts ran the same step 2x apart between calls, and one slowed 2x within a call: a pair whose
    host speed (env.host_op_us at the start, host_op_us_end at the end of each run) moved over 15% is marked."""
    from flux_cp.report.harness import _host_changed, _host_speeds
    from flux_cp.report.render import _against_target

    lit = {"env": {"host_op_us": 2.0}, "host_op_us_end": 2.1}
    bare = {"env": {"host_op_us": 4.1}, "host_op_us_end": 4.0}
    old = {"env": {}}  # a summary from before host_op_us
    assert _host_speeds(lit) == [2.0, 2.1] and _host_speeds(old) == []
    assert _host_changed(_host_speeds(lit) + _host_speeds(bare)) and not _host_changed(_host_speeds(lit))
    assert not _host_changed(_host_speeds(old) + _host_speeds(lit))
    row = {"overhead_pct": 1.0, "within_target": True, "noisy": False, "host_changed": True,
           "host_op_us": {"lightning": [2.0, 2.1], "bare": [4.1, 4.0]}}
    assert _against_target(row, 3.0) == "within 3% (the host's speed moved 2-4.1 us/op over the pair: not comparable)"


def test_the_twin_is_the_bare_run_of_the_lightning_runs_suite(tmp_path):
    """Two bare runs of the same settings: the one in the Lightning run's suite folder is its twin even when another
    suite's is later (an H200 graph pair was held against a later suite's bare run: +84% instead of +21%)."""
    for name, h in (("lit-w1", None), ("bare-w1", "bare")):
        put(tmp_path, f"w1/{name}", summary(W1, name, h), age=100)
    put(tmp_path, "suite_a/lit-w2", summary(W2, "lit-w2", "lightning"), age=50)
    put(tmp_path, "suite_a/bare-w2", summary(W2, "bare-w2", "bare"), age=60)  # 55 ms, older
    later = summary(W2, "bare-w2", "bare")
    later["per_step"]["step_ms"] = [30.0] * 8
    later["metrics"]["step_ms"] = stats([30.0] * 8)
    put(tmp_path, "suite_b/bare-w2", later, age=10)
    rows = [r for r in build(tmp_path, user="allgather-kv").harness["rows"] if r["W"] == 2]
    assert len(rows) == 1 and "suite_a" in rows[0]["bare_run"] and rows[0]["other_bare_runs"] == 1
    assert rows[0]["overhead_pct"] == pytest.approx(100 * (60 / 55 - 1))


def test_verdict_looks_two_levels_down_only(tmp_path):
    """runs/<name>/<time>/summary.json is found; a baseline deeper down is not (an --output under /tmp or $HOME made
    the verdict walk that whole tree at each run's end)."""
    bare2 = summary(W2, "bare-w2", "bare")
    put(tmp_path / "a" / "b", "bare-w1", summary(W1, "bare-w1", "bare"), age=1)  # three levels down
    assert "no W=1 baseline" in verdict(bare2, tmp_path / "x", [tmp_path])[0]
    found = put(tmp_path / "a", "bare-w1", summary(W1, "bare-w1", "bare"), age=1).parent  # two levels down
    assert f"vs {found} (W=1)" in verdict(bare2, tmp_path / "x", [tmp_path])[0]


def test_a_priced_simulated_rank_reads_its_priced_step_in_samples_per_second(tmp_path):
    """The closing line of a simulated GPU rank whose collectives were priced (summary.json `ranked`): its step with
    them, tokens/s a GPU and MFU there, and, training two samples a step against a one-sample W=1 run, its speedup as
    a ratio of samples/s (data parallelism is not a faster step); no 'compute only'."""
    lit1 = put(tmp_path, "lit-w1", summary(W1, "lit-w1", "lightning"), age=100).parent
    d = summary(W2, "lit-w2", "lightning") | {"simulate_world": 2}
    d["throughput"] = dict(d.get("throughput") or {}, samples_per_step=2)
    d["ranked"] = {"step_ms": 110.0, "exposed_comm_ms": 50.0, "tokens_per_s_per_gpu": 1234.0, "mfu": 0.4,
                   "link": "h200-nvlink4", "basis": "a simulated rank, its collectives priced with h200-nvlink4"}
    line, _ = verdict(d, tmp_path / "x", [tmp_path])
    assert "; 110 ms with its collectives priced with h200-nvlink4 (1,234 tokens/s a GPU, MFU 40%)" in line
    assert f", {med('lit-w1') * 2 / 110.0:.2f}x the samples/s of {lit1} (W=1, 1 sample(s) a step)" in line
    assert "compute only" not in line


def test_interleaved_twins_pool_over_seeds(tmp_path):
    """Lightning runs with their bare twin inside (--interleave-bare), one a data seed on a host whose speed moved
    between them (steps 55-62 ms): each run's overhead is against its own twin, and the pool over the seeds is the
    mean of those, its interval within their range (flux_harness_user.yaml: what resolves 3% over five runs)."""
    from flux_cp.runs.results import pooled_overhead

    overheads = []
    for seed, (lit_ms, twin_ms) in enumerate([(60.0, 58.5), (57.0, 55.6), (62.0, 60.4)]):
        d = summary(W2, "lit-w2", "lightning")
        d["config"]["data"]["seed"] = seed
        d["per_step"]["step_ms"] = [lit_ms + 0.1 * (i % 3) for i in range(12)]
        d["metrics"]["step_ms"] = stats(d["per_step"]["step_ms"])
        twin = [twin_ms + 0.1 * (i % 2) for i in range(16)]
        est, ci = pooled_overhead(d["per_step"]["step_ms"], twin)
        d["interleaved_bare"] = {"every": 4, "steps": 16, "step_ms": twin, "lightning_steps": 12,
                                 "overhead_pct": est, "ci95_pct": ci}
        put(tmp_path, f"lit-w2-s{seed}", d, age=50 - seed)
        overheads.append(est)
    report = build(tmp_path, user="allgather-kv")
    h = json.loads(json.dumps(report.to_dict()))["harness"]
    assert len(h["interleaved"]) == 3
    (g,) = h["interleaved_pooled"]
    assert (g["W"], g["runs"]) == (2, 3) and g["overhead_pct"] == pytest.approx(statistics.fmean(overheads))
    lo, hi = g["ci95_pct"]
    assert min(overheads) - 0.2 <= lo <= g["overhead_pct"] <= hi <= max(overheads) + 0.2
    assert g["verdict"] == "within" and hi < 3  # the runs' overheads 2.5-2.6%
    md = write_report(report, tmp_path / "report")["md"].read_text()
    assert f"allgather-kv W=2: {g['overhead_pct']:+.1f}% over 3 runs (95% interval {lo:+.1f}%" in md
