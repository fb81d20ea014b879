"""The harness is not what it measures: the Lightning run and its bare twin (--harness bare: the same FluxStep in a
plain loop, its own launcher) train alike, issue the same collectives, and the Lightning run adds no host wait
(timing reads after the fact, Lightning's per-step SIGTERM sync thinned out) that the bare loop does not have.

Runs: fp64 exact settings (conftest.EXACT: 10 optimizer steps, every first-step gradient and final parameter), W=1
and real gloo W=2 under allgather-kv + DDP and ulysses + ZeRO; simulated W=2 pairs for the ledger.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from flux_cp.runs.results import steadiness, validate

from .conftest import EXACT, EXACT_STEPS, TINY, assert_exact, bench, load_exact

W2 = {  # name: the run's settings; the Lightning runs also set Lightning's SIGTERM check cadence
    "agkv-ddp": ("--devices", 2, "--cp", "allgather-kv", "--weights", "ddp"),
    "ulysses-zero": ("--devices", 2, "--cp", "ulysses", "--weights", "zero"),
}
SIGTERM_EVERY = {"agkv-ddp": 4, "ulysses-zero": 1}  # 1: stock Lightning (a check before every step)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(name, harness): run folder}: the W=2 pairs and a bare W=1 run, two at a time on the 2 cores."""
    jobs = {("w1", "bare"): ("--devices", 1, "--harness", "bare")}
    for name, args in W2.items():
        jobs[name, "bare"] = (*args, "--harness", "bare")
        jobs[name, "lightning"] = (*args, "--sigterm-every", SIGTERM_EVERY[name])
    with ThreadPoolExecutor(2) as pool:
        futures = {}
        for (name, harness), args in jobs.items():
            out = tmp_path_factory.mktemp(f"{name}-{harness}")
            futures[name, harness] = (out, pool.submit(bench, *EXACT, "--output", out, *args))
        folders = {}
        for key, (out, job) in futures.items():
            r = job.result()
            assert r.returncode == 0, (key, r.stderr[-3000:])
            folders[key] = out
    return folders


def _summary(folder) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_bare_w1_trains_as_the_lightning_run(runs, single_process):
    bare = load_exact(runs["w1", "bare"])
    assert bare["summary"]["harness"] == "bare" and single_process(1)["summary"]["harness"] == "lightning"
    assert_exact(bare, single_process(1), rtol=1e-12)


@pytest.mark.parametrize("name", W2)
def test_bare_w2_trains_as_the_lightning_run(runs, name):
    """Same losses at all 10 steps, first-step gradients and final parameters: the same step, over real gloo ranks."""
    bare, lit = load_exact(runs[name, "bare"]), load_exact(runs[name, "lightning"])
    assert len(bare["summary"]["loss"]) == EXACT_STEPS
    assert_exact(bare, lit, rtol=1e-12)
    for d, harness in ((bare["summary"], "bare"), (lit["summary"], "lightning")):
        assert validate(d) == [] and d["harness"] == harness and d["world_size"] == 2 and d["complete"]
        assert d["metrics"]["step_ms"]["rank_max_median"] >= d["metrics"]["step_ms"]["rank_min_median"] > 0
    assert bare["summary"]["optimizer_params"] == lit["summary"]["optimizer_params"]  # rank 0's ZeRO share
    # the ledger in every 4th measured step (out of step_ms: timed) and warm-up; no op regions in the bare loop
    timed = {"step_timed_ms", "host_timed_ms", "loop_timed_ms"}
    assert not bare["summary"]["op_regions"]
    assert set(bare["summary"]["metrics"]) == {"step_ms", "host_ms", "loop_ms"} | timed
    kinds = bare["summary"]["step_kinds"]
    assert kinds["timed"] == len(bare["summary"]["comm"]["ledger"]) >= 1 and kinds["plain"] > kinds["timed"]


@pytest.mark.parametrize("name", W2)
def test_lightning_sigterm_sync_runs_every_n_steps(runs, name):
    """Lightning's per-step broadcast + .item(), counted in a real 2-rank run: every 4th step by the setting, every
    step with --sigterm-every 1 (stock Lightning)."""
    d = _summary(runs[name, "lightning"])
    steps, every = EXACT_STEPS, SIGTERM_EVERY[name]
    assert d["sigterm_checks"] == {"every": every, "steps": steps, "broadcasts": -(-steps // every)}


@pytest.mark.parametrize("name", W2)
def test_timing_reads_nothing_inside_the_loop(runs, name):
    """Every measured step is read after the loop, as the bare loop reads its own: the host does nothing between
    steps for the timer's sake (no read, no wait, no logging)."""
    reads = _summary(runs[name, "lightning"])["reads"]
    measured = EXACT_STEPS - 1  # EXACT: 1 warm-up step
    assert reads["in_loop"] == 0 and reads["waited_in_loop"] == 0 and reads["after_loop"] == measured


def test_summary_has_wall_split_and_steadiness(runs):
    for key in (("agkv-ddp", "lightning"), ("agkv-ddp", "bare")):
        d = _summary(runs[key])
        w = d["wall_s"]
        parts = ("startup", "warmup", "measured", "teardown")
        assert all(w[k] >= 0 for k in parts) and w["startup"] > 0 and w["measured"] > 0
        assert abs(sum(w[k] for k in parts) - w["total"]) < 0.01
        assert d["sdpa_backend"] == "auto" and d["sdpa_kernel"] in ("flash", "math")  # what SDPA ran on this CPU
        assert d["env"]["host_op_us"] > 0 and d["host_op_us_end"] > 0  # the host's speed at the start and end
        assert d["memory"]["host_max_rss_gib"] > 0.05  # CPU: the process's peak resident set (torch alone is more)
        st = d["steadiness"]
        assert sum(d["step_kinds"].values()) == EXACT_STEPS - 1  # measured: step_ms from the plain ones
        assert st["n"] == d["step_kinds"]["plain"] and st["ci95"][0] <= st["median"] <= st["ci95"][1]
        assert st["median"] == d["metrics"]["step_ms"]["median"]


def test_steadiness_names_two_modes_and_drift():
    steady = steadiness([10.0, 10.1, 9.9, 10.05, 10.0, 9.95, 10.1, 10.0])
    assert steady["steady"] and steady["modes"] is None and steady["problems"] == []
    two = steadiness([10.0] * 6 + [15.0] * 4)
    assert two["modes"] == [{"median": 10.0, "n": 6}, {"median": 15.0, "n": 4}] and "bimodal" in two["problems"]
    slow_start = steadiness([14.0, 13.0, 12.0, 11.0, 10.0, 10.0, 10.0, 10.0])
    assert slow_start["drift_pct"] < -5 and "drift" in slow_start["problems"]
    one_outlier = steadiness([10.0] * 9 + [30.0])  # one slow step is not a mode
    assert one_outlier["modes"] is None


def test_simulated_bare_and_lightning_record_the_same_ledger(tmp_path):
    """Rank 0 of a simulated W=2 job (fake group): the bare loop issues what the Lightning run issues, collective for
    collective (DDP's buckets, ZeRO's broadcasts, Ulysses' all-to-alls)."""
    common = ("--config", TINY, "--warmup-steps", 1, "--steps", 6, "--simulate-world", 2, "--cp", "ulysses",
              "--weights", "zero", "--wandb-mode", "disabled")
    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(bench, *common, "--output", tmp_path / h, "--harness", h) for h in ("bare", "lightning")]
        for job in jobs:
            r = job.result()
            assert r.returncode == 0, r.stderr[-3000:]
    bare, lit = (_summary(tmp_path / h) for h in ("bare", "lightning"))

    def key(d):
        return [[(e["kind"], e["bytes"], e["group_size"], e["async"]) for e in s["collectives"]]
                for s in d["comm"]["ledger"]]

    # recorded in the instrumented steps only (measured steps 1 and 5 of 6), the same ones in both harnesses
    assert [s["step"] for s in bare["comm"]["ledger"]] == [s["step"] for s in lit["comm"]["ledger"]] == [2, 6]
    assert len(key(bare)[0]) > 10 and key(bare) == key(lit)
    assert bare["collectives"] == "fake" and bare["loss"] is None and bare["run_name"].endswith("-bare")


def test_ledger_off_records_nothing_and_the_report_prices_the_shapes(tmp_path):
    """--ledger false (to measure the ledger's own host cost): no collective is recorded in either harness, and the
    report still prices the step's communication, from the collectives the shapes imply."""
    from flux_cp.predict import links
    from flux_cp.report import build

    common = ("--config", TINY, "--warmup-steps", 1, "--steps", 2, "--cp", "ulysses", "--weights", "zero",
              "--wandb-mode", "disabled", "--ledger", "false")
    jobs = {"w1": ("--cp", "none"), "bare": ("--simulate-world", 2, "--harness", "bare"),
            "lightning": ("--simulate-world", 2)}
    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(bench, *common, *extra, "--output", tmp_path / name) for name, extra in jobs.items()]
        for job in done:
            r = job.result()
            assert r.returncode == 0, r.stderr[-3000:]
    for name in jobs:
        d = _summary(tmp_path / name)
        assert validate(d) == [] and "comm" not in d and d["config"]["run"]["ledger"] is False
    rows = [row for c in build(tmp_path, cpu_link=links.flat(100)).configs for row in c.rows if row.W == 2]
    assert len(rows) == 2 and all(not row.a["comm_source"].startswith("ledger") for row in rows)
    assert all(row.a["prediction"]["kv_ms"] > 0 and row.a["prediction"]["grad_ms"] > 0 for row in rows)


def test_an_interleaved_bare_twin_leaves_training_alone_and_reports_its_steps(single_process, tmp_path):
    """--interleave-bare 3 over real gloo ranks: a bare twin trains 3 steps after every 3 measured Lightning steps; the
    Lightning run still trains exactly as one process (fp64, 10 steps), and summary.json holds the twin's steps (a
    block's first left out) and Lightning's overhead over them with its interval."""
    from .conftest import exact_run

    got = exact_run(tmp_path, "--devices", 2, "--cp", "allgather-kv", "--interleave-bare", 3)
    assert_exact(got, single_process(1), rtol=1e-12)
    tw = got["summary"]["interleaved_bare"]
    assert tw["every"] == 3 and tw["steps"] == 3 * 2 and len(tw["step_ms"]) == 6 and min(tw["step_ms"]) > 0
    lo, hi = tw["ci95_pct"]
    assert tw["lightning_steps"] >= 5 and lo <= tw["overhead_pct"] <= hi
    from flux_cp.report import build
    from flux_cp.report import write as write_report

    report = build(tmp_path)
    (g,) = report.harness["interleaved"]
    assert (g["W"], g["every"], g["steps"]) == (2, 3, [tw["lightning_steps"], 6]) and g["ci95_pct"] == [lo, hi]
    md = write_report(report, tmp_path / "report")["md"].read_text()
    assert f"W=2: {tw['overhead_pct']:+.1f}% (95% interval {lo:+.1f}% to {hi:+.1f}%" in md
