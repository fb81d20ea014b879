"""The host as an axis (issue 40 item 2): predict/host.py's model of a step against the host's speed, fitted on a
regime's runs on the host as it is and checked on the same regime on an emulated slower host, in the regime table
(report/host_axis.py). Fixture summaries: real H200 ones (tests/test_report_regimes.py) with the idle probes' device
busy and host issue times and the host probes' speeds set from a known step(h) for each W."""

import json

import pytest

from flux_cp.predict.host import HostModel, fit, host_us, ranges
from flux_cp.report import build
from flux_cp.report import write as write_report
from flux_cp.report.host_axis import GRID, _axis
from flux_cp.runs.results import stats

from .test_report_regimes import LINK, NONE_W1, SIM, put, rid, summary

US = 4.0  # the host as it is: us per tiny op (its probe's mean)
# W: (D device busy, H host issue, r rest) at US, ms. W=1 device bound; W=2 balanced; W=8 host bound
TRUE = {1: (85.0, 30.0, 1.0), 2: (50.0, 45.0, 1.4), 8: (30.0, 60.0, 1.0)}


def true_step(W: int, h: float) -> float:
    """The step on a host h times as slow, written out here (not through the model under test)."""
    d, hi, r = TRUE[W]
    return max(d, hi * h) + r


def probed(d: dict, W: int, h: float, step: float | None = None) -> dict:
    """The summary of a run on a host h times as slow: its step, idle probes and host probes."""
    step = true_step(W, h) if step is None else step
    busy, issue, _ = TRUE[W]
    for name, v in (("step_ms", step), ("device_busy_ms", busy), ("host_issue_ms", issue * h)):
        d["per_step"][name] = [v] * 8
        d["metrics"][name] = stats([v] * 8)
    d["probe_hold_ms"] = [1.5 * step + 2.0] * 2
    probe = {"median_us": US * h * 1.2, "min_us": US * h, "max_us": US * h * 1.5, "mean_us": US * h, "reps": 7}
    d["env"]["host_probe"] = probe
    d["host_speed"] = {"before": probe, "after": probe, "changed": False}
    if h != 1:
        d["config"]["run"]["host_slowdown"] = 1.25
    return d


@pytest.fixture(scope="module")
def axis(tmp_path_factory):
    """One regime (plain flash W=1, the ring at W = 2, 8) on the host as it is and on a host 1.25x as slow (its W=8
    step measured 10% above the truth: the check must show it)."""
    root = tmp_path_factory.mktemp("host_axis")
    for h, tag in ((1.0, "fast"), (1.25, "slow")):
        put(root, f"{tag}-w1", probed(summary(NONE_W1, f"{tag}-w1", 0, sdpa_kernel="flash"), 1, h))
        for W in (2, 8):
            step = true_step(W, h) * (1.1 if (tag, W) == ("slow", 8) else 1.0)
            put(root, f"{tag}-w{W}", probed(summary(SIM[W], f"{tag}-w{W}", 0, sdpa_kernel="flash"), W, h, step))
    report = build(root, link=LINK)
    write_report(report, root / "report")
    return {"report": report, "json": json.loads((root / "report" / "report.json").read_text()),
            "md": (root / "report" / "report.md").read_text()}


FAST, SLOW = rid("plain W=1, flash", 1), rid("plain W=1, flash", 1) + " | host 1/1.25 (emulated)"


def test_the_model_fits_a_run_and_predicts_the_step_on_another_host():
    """step(h) = max(D, H h) + r: the device-bound W=1 step does not move on a 1.5x slower host, the host-bound W=8
    one follows the host, the balanced W=2 one turns host bound; a faster host stops at D + r."""
    for W in TRUE:
        d = probed(summary(SIM[2] if W > 1 else NONE_W1, "x", 0), W, 1.0)
        m, why = fit(d)
        assert why is None and host_us(d) == US and m.host_us == US
        assert m.residual_ms == pytest.approx(TRUE[W][2])
        for h in (0.5, 0.8, 1.0, 1.27, 1.5, 2.0, 3.0):
            assert m.step_at(m.h_of(US * h)) == pytest.approx(true_step(W, h), rel=1e-12)
    m = fit(probed(summary(SIM[2], "x", 0), 2, 1.0))[0]
    assert m.host_bound_share == pytest.approx(1 - 50.0 / 51.4) and m.host_paced_above == pytest.approx(50 / 45)
    assert m.step_at(0.5) == pytest.approx(51.4) and m.step_at(2.0) == pytest.approx(91.4)
    # no idle probe (a CPU run, a bare loop before it had one): no model, and why
    old = summary(SIM[2], "old", 75.0)
    assert fit(old)[0] is None and "no idle probe" in fit(old)[1]
    assert host_us(old) is None and host_us({"env": {"host_op_us": 3.0}, "host_op_us_end": 5.0}) == 4.0
    # a probe whose host time reached its hold: the host waited for the device in it, D and H are upper bounds
    stalled = probed(summary(SIM[2], "s", 0), 2, 1.0)
    stalled["probe_hold_ms"] = [46.0]
    assert fit(stalled)[0].stalled and not m.stalled
    assert ranges([1, 2, 3, 4, 5], [False, True, True, False, True]) == [(2, 3), (5, 5)]
    assert HostModel(10.0, 8.0, 4.0, None).h_of(None, 1.5) == 1.5  # no probe: the nominal slowdown
    # a W=2 step that never gets below 1.3x the W=1 one: no host reproduces the 1.66x, and the statement says so
    ax = _axis(HostModel(86.0, 85.0, 30.0, US), {2: HostModel(66.0, 65.0, 40.0, US)}, {})
    assert ax["reproduces_h"] == [] and ax["statement"].startswith(
        "reproduces on no host from h = 0.25 to 8 (x the W=2 run's host, 4 us/op): W=2 is at most 1.30x")


def test_the_regime_table_carries_each_cells_host_bound_share_and_its_speedup_by_host(axis):
    j = axis["json"]
    cells = {(c["regime"], c["W"]): c for c in j["regimes"]}
    assert set(cells) == {(r, W) for r in (FAST, SLOW) for W in (2, 8)}
    for W in (2, 8):
        c = cells[FAST, W]
        busy, issue, _ = TRUE[W]
        assert c["host_bound_share"] == pytest.approx(1 - busy / true_step(W, 1.0))
        assert c["host_issue_ms"] == issue and c["host_us"] == US
        assert c["host_model"]["device_busy_ms"] == busy and not c["host_model"]["stalled"]
        extra = c["predicted_step_ms"] - c["step_ms"]  # the simulated rank's priced communication, kept as at h = 1
        for h in GRID:  # the W=1 step over the W step, both on a host h times as slow, written out
            assert c["speedup_at_host"][f"{h:g}"] == pytest.approx(true_step(1, h) / (true_step(W, h) + extra),
                                                                   rel=1e-9)
        assert c["speedup_at_host"]["1"] == pytest.approx(c["speedup"], rel=1e-9)  # h = 1: the table's speedup
    ax = j["regime_summary"][FAST]["host_axis"]
    assert "busy 50 ms of its 51.4 ms step, its host issues it in 45 ms: device-bound" in j["regime_summary"][FAST][
        "mechanism"]  # the probe's host time, not the plain step's (a host paced by the device)
    assert ax["reference_us"] == US and ax["speedups"]["2"]["8"] == cells[FAST, 8]["speedup_at_host"]["2"]
    # where the verdict holds on the axis: 1.66x at W=2 (+-10%), W=8 under 1.25x the W=2 speedup
    lo, hi = ax["reproduces_h"][0]
    extra = {W: cells[FAST, W]["predicted_step_ms"] - cells[FAST, W]["step_ms"] for W in (2, 8)}

    def speedups(h):
        return {W: true_step(1, h) / (true_step(W, h) + extra[W]) for W in (2, 8)}

    for h in (lo, hi):
        s = speedups(h)
        assert 1.66 * 0.9 <= s[2] <= 1.66 * 1.1 and s[8] / s[2] < 1.25
    for h in (lo / 1.02, hi * 1.02):
        s = speedups(h)
        assert not (1.66 * 0.9 <= s[2] <= 1.66 * 1.1 and s[8] / s[2] < 1.25)
    assert ax["statement"] == (f"reproduces on hosts of {US * lo:.3g}-{US * hi:.3g} us/op (h = {lo:.2f}-{hi:.2f}); "
                               f"h: x the W=2 run's host, {US:.3g} us/op")
    md = axis["md"]
    section = md[md.index("### The host as an axis"):]
    assert f"| 1 | 2 | {cells[FAST, 2]['host_bound_share']:.0%} | 50 / 45 |" in section
    assert f"{cells[FAST, 8]['speedup_at_host']['1.5']:.2f}x" in section and ax["statement"] in section
    h = j["headline"]  # the verdict names the table's regime, its speedups and its host statement
    assert (h["regime"], h["host_axis"]) == (FAST, ax["statement"])
    assert h["speedups"] == j["regime_summary"][FAST]["speedups"]
    assert "**On other hosts** (regime 1" in md and ax["statement"] in md[md.index("## Verdict"):md.index("## Method")]


def test_the_model_is_checked_on_the_slowed_hosts_runs(axis):
    """The host-as-is model at each slowed run's measured host speed (h = 1.25 by its probe) against its step: exact
    where the runs follow step(h), -9.1% where the W=8 step took 10% more."""
    s = axis["json"]["regime_summary"]
    (ck,) = s[FAST]["host_axis"]["checks"]
    assert ck == s[SLOW]["host_axis"]["checks"][0] and ck["regime"] == SLOW and ck["against"] == FAST
    rows = {r["W"]: r for r in ck["rows"]}
    assert set(rows) == {1, 2, 8} and all(r["h"] == pytest.approx(1.25) and r["h_source"] == "measured"
                                          for r in rows.values())
    for W in (1, 2):
        assert rows[W]["predicted_step_ms"] == pytest.approx(true_step(W, 1.25)) and abs(rows[W]["error_pct"]) < 1e-9
    assert rows[8]["measured_step_ms"] == pytest.approx(1.1 * true_step(8, 1.25))
    assert rows[8]["error_pct"] == pytest.approx(100 * (1 / 1.1 - 1)) and ck["max_abs_error_pct"] == pytest.approx(
        100 * (1 - 1 / 1.1))
    # the speedup: the communication exposed beside a longer step is priced anew in the measured one, kept in the model
    assert rows[2]["predicted_speedup"] == pytest.approx(rows[2]["measured_speedup"], rel=1e-3)
    assert rows[2]["speedup_error_pct"] == pytest.approx(100 * (rows[2]["predicted_speedup"] /
                                                               rows[2]["measured_speedup"] - 1))
    cell = next(c for c in axis["json"]["regimes"] if c["regime"] == SLOW and c["W"] == 8)
    assert cell["host_check"] == rows[8]
    assert "W=8 at h = 1.25 step" in axis["md"] and "(largest error 9.1%)" in axis["md"]
    # the slowed runs' probe repetitions (5.0-7.5 us/op): a steady host, no caveat
    assert ck["probe_range_us"] == pytest.approx([US * 1.25, US * 1.25 * 1.5]) and "host moved" not in axis["md"]


def test_a_check_on_a_host_that_moved_says_so():
    """Probe repetitions spread wider than 2x over the slowed runs (an H100 lease under --host-slowdown: 4.4-36
    us/op): the model's error is reported with the caveat that the host itself moved."""
    from flux_cp.report.host_axis import _unsteady

    assert _unsteady({"probe_range_us": [5.0, 7.5]}) == "" and _unsteady({"probe_range_us": None}) == ""
    assert "the host moved while measured (probe repetitions 4.4-36 us/op" in _unsteady({"probe_range_us": [4.4, 36]})


def test_h_1_is_the_host_the_w2_speedup_was_measured_on(tmp_path):
    """A lent host moves (probes 3-8 us/op within one lease): here the W=1 run's probe read twice the W=2 run's while
    its device-bound step did not move. The axis's h = 1 is the W=2 run's host, so the speedup there is the regime
    table's and the verdict's host statement agrees with the verdict's speedup (one voice)."""
    w1 = probed(summary(NONE_W1, "w1", 0, sdpa_kernel="flash"), 1, 1.0)
    moved = {**w1["host_speed"]["before"], "mean_us": 2 * US, "median_us": 2.4 * US, "min_us": 2 * US}
    w1["env"]["host_probe"] = moved
    w1["host_speed"] = {"before": moved, "after": moved, "changed": False}
    put(tmp_path, "w1", w1)
    for W in (2, 8):
        put(tmp_path, f"w{W}", probed(summary(SIM[W], f"w{W}", 0, sdpa_kernel="flash"), W, 1.0))
    write_report(build(tmp_path, link=LINK), tmp_path / "report")
    j = json.loads((tmp_path / "report" / "report.json").read_text())
    ax = j["regime_summary"][FAST]["host_axis"]
    assert ax["reference_us"] == US and ax["baseline_model"]["host_us"] == 2 * US
    for c in j["regimes"]:
        assert c["speedup_at_host"]["1"] == pytest.approx(c["speedup"], rel=1e-9)
    at_1 = ax["speedups"]["1"]["2"]
    assert at_1 == pytest.approx(j["regime_summary"][FAST]["speedups"]["2"], rel=1e-9)
    # the table's verdict (reproduces) holds at h = 1 of the axis too; on the W=1 run's host it would not have
    assert j["regime_summary"][FAST]["verdict"] == "reproduces"
    assert any(lo <= 1.0 <= hi for lo, hi in ax["reproduces_h"]) and "x the W=2 run's host, 4 us/op" in ax["statement"]
