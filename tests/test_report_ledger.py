"""The report's reading of real CPU runs' profiles and ledgers, and its verdicts: measured communication and idle
time replace estimates, kernel classes per W, noisy pairs are not conclusive, a ledger missing a collective (the
gradient all-reduce, the K/V exchange) is flagged, a step-graph run borrows its eager twin's ledger, and the targets
and per-work rows are held against the W=1 steps they name."""

import json
import os

import pytest

from flux_cp.predict import links
from flux_cp.report import build, tables
from flux_cp.report import write as write_report

from .conftest import write


def test_profile_comm_and_idle_replace_estimates(train_runs, tmp_path):
    t1, t2 = (json.loads(train_runs[w].read_text()) for w in (1, 2))
    step2 = t2["metrics"]["step_ms"]["median"]
    bd = {"attention": 1.0, "gemm": 1.0, "comm_attention": 0.01 * step2, "comm_grad": 0.02 * step2, "other": 1.0,
          "busy": 0.6 * step2, "idle": 0.4 * step2, "step": step2}
    t2["profile"] = {"steps": 2, "trace_files": [], "breakdown_ms": bd, "idle_frac": 0.4, "ops_call_ms": {}}
    for name, d in (("w1", t1), ("w2", t2)):
        write(tmp_path / name / "summary.json", d)
    (c,) = build(tmp_path, cpu_link=links.flat(100)).to_dict()["configurations"]
    row = c["rows"][1]
    assert row["comm_source"] == "measured (profile)" and row["idle_source"] == "profile"
    assert row["parts_ms"]["comm_kv"] == pytest.approx(bd["comm_attention"])
    assert row["parts_ms"]["comm_grad"] == bd["comm_grad"] and row["parts_ms"]["idle"] == pytest.approx(bd["idle"])
    assert "host bound at W=2: device idle 40% of the step" in row["verdict"]
    assert row["amdahl"]["residual_named"] == "host"
    # events idle (measured steps) wins over the profile; a profile without comm kernels gets the estimate
    t2["idle"] = {"device_idle_frac": 0.1, "source": "events"}
    t2["profile"]["breakdown_ms"] |= {"comm_attention": 0.0, "comm_grad": 0.0}
    write(tmp_path / "w2" / "summary.json", t2)
    (c,) = build(tmp_path, cpu_link=links.flat(100)).to_dict()["configurations"]
    row = c["rows"][1]
    assert row["idle_source"] == "events" and row["idle_ms"] == pytest.approx(0.1 * step2)
    assert row["comm_source"].startswith(("byte counts priced with flat-100GBps", "ledger priced with flat-100GBps"))
    assert "no communication kernels" in row["notes"][0]
    rep = build(tmp_path).to_dict()  # CPU runs without a CPU profile: comm not priced
    (c,) = rep["configurations"]
    assert c["rows"][1]["comm_source"].startswith("not priced") and c["rows"][1]["prediction"]["exposed_ms"] == 0
    # the real W=2 run's K/V waits are inside its SDPA regions: the reconcile section says so (issue 25)
    (r2,) = rep["reconcile"]["rows"]
    assert r2["kv_unsplit"] and any("K/V exchange is neither profiled nor priced" in s and "attention chunking" in s
                                    for s in rep["reconcile"]["answer"])


def test_kernel_classes_per_w_from_the_latest_profiled_runs(train_runs, tmp_path):
    """The by-class table takes, per W, the newest run that has a profile (a newer unprofiled W=1 run is the
    step baseline but has no kernels), and divides by W=1's."""
    t1, t2 = (json.loads(train_runs[w].read_text()) for w in (1, 2))
    bd1 = {"attention": 4.0, "gemm": 10.0, "other": 2.0, "optimizer": 3.0, "busy": 19.0}
    bd2 = {"attention": 2.2, "gemm": 5.5, "other": 1.5, "optimizer": 3.0, "busy": 12.2}
    write(tmp_path / "w1-prof" / "summary.json", t1 | {"profile": {"breakdown_ms": bd1}})
    os.utime(tmp_path / "w1-prof" / "summary.json", (1, 1))  # older than the unprofiled W=1 run below
    write(tmp_path / "w1" / "summary.json", t1 | {"run_name": "w1-plain"})
    write(tmp_path / "w2" / "summary.json", t2 | {"profile": {"breakdown_ms": bd2}})
    (c,) = build(tmp_path).configs
    assert c.baseline.run.name == "w1-plain"
    (title, hdr, rows), = [t for t in tables(c) if t[0].startswith("Kernel time per step by class")]
    assert [r[0] for r in rows] == ["1", "2"] and rows[0][1] == t1["run_name"]
    assert rows[1][hdr.index("gemm ms (x W=1)")] == "5.5 (0.55)"
    assert rows[1][hdr.index("optimizer ms (x W=1)")] == "3 (1)"


def test_noisy_pairs_are_not_conclusive(train_runs, tmp_path):
    """A step spread larger than the difference reported: "not conclusive: noisy", never "superlinear"."""
    t1, t2 = (json.loads(train_runs[w].read_text()) for w in (1, 2))
    s1 = t1["metrics"]["step_ms"]["median"]
    t2["metrics"]["step_ms"] |= {"median": s1 / 2.5, "min": s1 / 2.5 * 0.99, "max": s1 / 2.5 * 1.01}  # superlinear
    t2["per_step"]["step_ms"] = [s1 / 2.5] * 8
    t1["per_step"]["step_ms"] = [s1] * 8  # steady steps on both sides
    write(tmp_path / "w1" / "summary.json", t1)
    write(tmp_path / "w2" / "summary.json", t2)
    (c,) = build(tmp_path).configs
    assert "superlinear" in c.rows[1].a["verdict"] and not c.rows[1].a["noise"]["noisy"]
    t2["per_step"]["step_ms"] = [s1 / 2.5 * k for k in (0.3, 0.5, 1.0, 1.0, 1.0, 2.5, 3.0, 4.0)]  # IQR > s1 - s2
    write(tmp_path / "w2" / "summary.json", t2)
    (c,) = build(tmp_path).configs
    a = c.rows[1].a
    assert a["noise"]["noisy"] and a["noise"]["kind"] == "IQR" and a["noise"]["spread_ms"] > a["noise"]["diff_ms"]
    assert "not conclusive: noisy" in a["verdict"] and "superlinear" not in a["verdict"]
    assert "perf_counter steps" in a["verdict"]
    write_report(build(tmp_path), tmp_path / "out")  # the rendered report carries the warning
    assert "not conclusive: noisy" in (tmp_path / "out" / "report.md").read_text()


def test_a_ledger_without_the_gradient_all_reduce_is_flagged(train_runs, tmp_path):
    """A DDP run whose ledger lacks the gradient all-reduce (--step-graph runs of 2026-12-04: the capture's backward
    collectives went unrecorded) says so in its notes; the same runs untouched do not."""
    t1, ts = (json.loads(train_runs[w].read_text()) for w in (1, "sim"))
    assert ts["weights"] == "ddp" and any(c["kind"] == "all_reduce" for c in ts["comm"]["ledger"][0]["collectives"])
    for step in ts["comm"]["ledger"]:
        step["collectives"] = [c for c in step["collectives"] if c["kind"] != "all_reduce"]
    for name, d in (("w1", t1), ("sim", ts)):
        write(tmp_path / name / "summary.json", d)
    (c,) = build(tmp_path, cpu_link=links.flat(100)).to_dict()["configurations"]
    assert any(n.startswith("W=2: the ledger holds no gradient all-reduce") for n in c["notes"]), c["notes"]
    for name, p in (("w1", train_runs[1]), ("sim", train_runs["sim"])):
        write(tmp_path / "untouched" / name / "summary.json", p.read_text())
    (c,) = build(tmp_path / "untouched", cpu_link=links.flat(100)).to_dict()["configurations"]
    assert not any("gradient all-reduce" in n for n in c["notes"]), c["notes"]


def test_a_step_graph_run_missing_its_backward_collectives_borrows_its_eager_twins_ledger(train_runs, tmp_path):
    """A --step-graph run whose ledger lacks the backward's collectives (2026-12-04's) is priced with the ledger of
    its eager twin (same strategy, weights and W): the same comm as the twin's row on the same step, and a note."""
    t1, ts = (json.loads(train_runs[w].read_text()) for w in (1, "sim"))
    graph = json.loads(json.dumps(ts)) | {"step_graph": True}
    for step in graph["comm"]["ledger"]:
        step["collectives"] = [c for c in step["collectives"] if c["kind"] != "all_reduce"]
    for name, d in (("w1", t1), ("w1g", t1 | {"step_graph": True}), ("eager", ts), ("graph", graph)):
        write(tmp_path / name / "summary.json", d)
    configs = build(tmp_path, cpu_link=links.flat(100)).to_dict()["configurations"]
    (g,) = [c for c in configs if "step graph" in c["key"]["compile"]]
    (e,) = [c for c in configs if "step graph" not in c["key"]["compile"]]
    assert any("priced with its eager twin's" in n for n in g["notes"]), g["notes"]
    assert not any("gradient all-reduce" in n for n in g["notes"]), g["notes"]
    (gw2,), (ew2,) = ([r for r in c["rows"] if r["W"] == 2] for c in (g, e))
    assert gw2["comm_source"].startswith("ledger of its eager twin") and ew2["comm_source"].startswith("ledger priced")
    gp, ep = gw2["prediction"], ew2["prediction"]
    assert gp["priced_ms"] == pytest.approx(ep["priced_ms"]) and gp["priced_ms"] > 0
    assert "all_reduce" in gp["bytes_by_kind"]


def test_a_step_graph_ledger_is_placed_as_its_eager_twins(train_runs, tmp_path):
    """A --step-graph run's ledger holds every collective (the graph's bytes) but not where the step issues and waits
    on it (a replay is one launch: all stamped at its start, blocking). With an eager twin among the runs it is
    priced on the twin's placement; alone, as blocking, one after another: the upper bound, and it says so."""
    t1, ts = (json.loads(train_runs[w].read_text()) for w in (1, "sim"))
    graph = json.loads(json.dumps(ts)) | {"step_graph": True}
    for step in graph["comm"]["ledger"]:
        step["collectives"] = [c | {"graph": True, "async": False, "issue_ms": 0.0, "wait_ms": None}
                               for c in step["collectives"]]
        step["phases"] = {}
    runs = {"w1": t1, "w1g": t1 | {"step_graph": True}, "eager": ts, "graph": graph}
    for name, d in runs.items():
        write(tmp_path / "twin" / name / "summary.json", d)
        if name != "eager":
            write(tmp_path / "alone" / name / "summary.json", d)

    def w2(root):
        configs = build(root, cpu_link=links.flat(1)).to_dict()["configurations"]
        (g,) = [c for c in configs if "step graph" in c["key"]["compile"]]
        return g["notes"], next(r for r in g["rows"] if r["W"] == 2)

    notes, twin = w2(tmp_path / "twin")
    assert any("placed as its eager twin's ledger places them" in n for n in notes), notes
    assert twin["comm_source"].startswith("ledger of its eager twin")
    notes, alone = w2(tmp_path / "alone")
    assert any("priced as blocking, one after another (the upper bound)" in n for n in notes), notes
    p, q = alone["prediction"], twin["prediction"]
    assert p["predicted_ms"] == pytest.approx(p["upper_ms"]) and p["priced_ms"] == pytest.approx(q["priced_ms"])
    assert q["predicted_ms"] < p["predicted_ms"]  # the twin overlaps what the graph alone cannot place


@pytest.mark.parametrize(("setting", "label"), [("split_conditioning", "split-cond"), ("ulysses_overlap", "overlap")])
def test_a_step_graph_run_borrows_the_twin_with_its_own_collectives(train_runs, tmp_path, setting, label):
    """Of two eager twins of a graph run, the one whose settings issue the graph's collectives places them, even when
    the other is newer: a twin with other collectives (--ulysses-qkv separate against fused, --split-conditioning,
    --zero-bucket-view) or other waits (--ulysses-overlap) would price another ledger (2026-12-04: a fused graph run
    took a separate twin's)."""
    t1, ts = (json.loads(train_runs[w].read_text()) for w in (1, "sim"))
    graph = json.loads(json.dumps(ts)) | {"step_graph": True}
    other = json.loads(json.dumps(ts))
    other["config"]["run"][setting] = True
    for step in other["comm"]["ledger"]:  # twice the bytes: a price the test can tell apart
        step["collectives"] = [c | {"bytes": 2 * c["bytes"]} for c in step["collectives"]]
    for name, d in (("w1", t1), ("w1g", t1 | {"step_graph": True}), ("eager", ts), ("graph", graph),
                    ("other", other)):  # written last: the newest
        write(tmp_path / name / "summary.json", d)
    configs = build(tmp_path, cpu_link=links.flat(100)).to_dict()["configurations"]
    (g,) = [c for c in configs if "step graph" in c["key"]["compile"]]
    (e,) = [c for c in configs if "step graph" not in c["key"]["compile"] and label not in c["strategy"]]
    (gw2,), (ew2,) = ([r for r in c["rows"] if r["W"] == 2] for c in (g, e))
    assert gw2["comm_source"].startswith(f"ledger of its eager twin {ew2['run']} priced with")
    assert gw2["prediction"]["priced_ms"] == pytest.approx(ew2["prediction"]["priced_ms"])


def test_a_ledger_without_the_kv_exchange_is_flagged(train_runs, tmp_path):
    """A simulated CP run whose ledger lacks its K/V exchange (under reduce-overhead the collectives replay inside
    CUDA graphs, where the ledger's Python kernels never run: the H200's ulysses runs) says its communication
    is partly unpriced, in the configuration's notes, instead of pricing a gradient sync alone in silence."""
    t1, ts = (json.loads(train_runs[w].read_text()) for w in (1, "sim"))
    for step in ts["comm"]["ledger"]:
        step["collectives"] = [c for c in step["collectives"] if c["kind"] not in ("all_gather", "reduce_scatter")]
    for name, d in (("w1", t1), ("sim", ts)):
        write(tmp_path / name / "summary.json", d)
    (c,) = build(tmp_path, cpu_link=links.flat(100)).to_dict()["configurations"]
    assert any(n.startswith("W=2: the ledger holds no K/V exchange") for n in c["notes"]), c["notes"]
    untouched = tmp_path / "untouched"
    for name, p in (("w1", train_runs[1]), ("sim", train_runs["sim"])):
        write(untouched / name / "summary.json", p.read_text())
    (c,) = build(untouched, cpu_link=links.flat(100)).to_dict()["configurations"]
    assert not any("K/V exchange" in n for n in c["notes"]), c["notes"]


def test_an_isolated_speedup_needs_calls_and_clear_ranges():
    """The isolated-op verdict's noise check: enough timed calls on both sides and min-max ranges apart."""
    from flux_cp.report.analysis import isolated_noisy

    def row(lo, hi, n=100):
        return {"device_range_ms": (lo, hi), "calls": n}

    assert not isolated_noisy(row(1.0, 1.1), row(0.5, 0.6))  # 2x, ranges apart
    assert isolated_noisy(row(1.0, 1.1), row(0.5, 0.6, n=5))  # the same, from 5 calls
    assert isolated_noisy(row(0.5, 1.1), row(0.45, 0.6))  # ranges overlap
    assert isolated_noisy(row(1.0, 1.1), None)


def test_the_targets_are_checked_against_the_w1_steps_they_name():
    """Issue 26's targets: W=2 >= 1.85x the user's W=1 step (context_parallel at world size 1) and >= 1.6x the best
    W=1 step, W=8 >= 5x the user's; each against its own W=1 step, not the plain one the tables divide by. The H200's
    figures of 2026-12-04: 39.0 ms at W=2 is 2.00x the user's 77.9 ms and 1.30x the compiled 50.8 ms."""
    from flux_cp.report.reconcile import target_lines

    alt = {"strategy": "ulysses", "compile": "default + step graph", "peak_gib": 12.4}
    s = {"rows": [{"W": 2, "predicted_speedup": 60.9 / 51.4, "peak_gib": 12.6}], "baseline_ms": 60.9,
         "strategy": "torch(allgather)", "alternatives": [alt | {"W": 2, "speedup": 60.9 / 39.0},
                                                          alt | {"W": 8, "speedup": 60.9 / 28.1}],
         "w1": {"user": {"ms": 77.9, "what": "the user's W=1 step"}, "best": {"ms": 50.8, "what": "the best"}}}
    two, eight = target_lines(s)
    assert two.startswith("Best at W=2: ulysses (compile default + step graph), 39 ms, peak 12.4 GiB per rank")
    assert "2.00x the user's W=1 step (77.9 ms; target >= 1.85x: met)" in two
    assert "1.30x the best (50.8 ms; target >= 1.6x: missed)" in two
    assert "2.77x the user's W=1 step (77.9 ms; target >= 5.0x: missed)" in eight
    (two,) = target_lines(s | {"w1": {"user": None, "best": None}, "alternatives": []})  # the user's own row alone
    assert "torch(allgather), 51.4 ms" in two and "no run of the user's W=1 step" in two and "not checked" in two


def test_a_row_training_more_samples_is_held_against_that_many_w1_steps():
    """per_work: data parallelism at B = W = 8 against a one-sample W=1 step is held against eight of them (its speedup
    a ratio of samples/s, ideal W); a row training as many samples as the baseline gets the baseline itself."""
    from flux_cp.report.analysis import per_work

    base = {"step_ms": 50.0, "projected_step_ms": 50.0, "loop_ms": 51.0, "step_spread_ms": 1.0, "samples_per_step": 1,
            "parts_ms": {"gemm": 30.0, "idle": 0.0}, "regions_ms": {"sdpa_fwd": 4.0, "sdpa_bwd": None}}
    dp = per_work(base, {"samples_per_step": 8})
    assert (dp["step_ms"], dp["loop_ms"], dp["parts_ms"], dp["regions_ms"], dp["work_factor"]) == (
        400.0, 408.0, {"gemm": 240.0, "idle": 0.0}, {"sdpa_fwd": 32.0, "sdpa_bwd": None}, 8.0)
    assert base["step_ms"] == 50.0 and per_work(base, {"samples_per_step": 1}) is base
