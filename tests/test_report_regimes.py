"""Regimes in the report (issue 24): run folders built from real H200 summaries (docs/archive/2026-12-03-h200-harness,
call1) with their step medians, batch, depth, SDPA kernel and Lightning sync cadence set, over the axes baseline kernel
x batch (+ depth, harness). Every expected cell and no other, speedups equal to the W=1 median over the report's own
prediction (predict.step_model on the run's ledger), verdicts from those numbers, and the note on a baseline of another
SDPA kernel than the ring's."""

import functools
import importlib.util
import json
import os
import tarfile
from pathlib import PurePosixPath

import pytest

from flux_cp.predict import links
from flux_cp.predict.step_model import predict_ledger
from flux_cp.report import build, regime_lines
from flux_cp.report import write as write_report
from flux_cp.report.regimes import recipe_for, verdict
from flux_cp.runs.results import stats

from .conftest import ROOT
from .test_report import assert_narrow

RUNS = ROOT / "docs" / "archive" / "2026-12-03-h200-harness" / "call1" / "runs.tar.xz"
CALL1 = PurePosixPath(".")  # the runs' folders inside RUNS
SIM = {2: CALL1 / "flux_harness" / "simulate_world-2_harness-bare",
       8: CALL1 / "flux_harness" / "simulate_world-8_harness-bare"}
SIM_LIT = {W: CALL1 / "flux_harness" / f"simulate_world-{W}_harness-lightning" for W in (2, 4)}
W1 = CALL1 / "flux_harness_w1"
NONE_W1, RING_W1 = W1 / "cp-none_harness-bare", W1 / "cp-torch_harness-bare"
NONE_W1_LIT = W1 / "cp-none_harness-lightning"
LINK = links.load("h200-nvlink4")
# W >= 2 step medians, ms: batch 1 gains little beyond W=2, batch 4 keeps gaining
SIM_MS = {(1, "2+4", 2): 75.0, (1, "2+4", 8): 70.0, (4, "2+4", 2): 100.0, (4, "2+4", 8): 40.0, (1, "6+12", 8): 90.0}
# each baseline's step as a multiple of the W=2 predicted step of its batch: the W=2 speedup it must give
TARGET = {(1, "cudnn"): 1.66, (1, "flash"): 1.00, (1, "ring"): 1.20, (4, "cudnn"): 1.70, (4, "flash"): 2.20,
          (4, "auto"): 1.55}
CUDNN, FLASH, AUTO = "plain W=1, cudnn", "plain W=1, flash", "plain W=1, auto"
RING = "context_parallel at world size 1"


def rid(kind: str, batch: int, depth: str = "2+4", sync: str = "bare") -> str:
    return f"{kind} | batch {batch} | depth {depth} | eager | {sync}"


@functools.cache
def _member(name: str) -> str:
    with tarfile.open(RUNS) as tar:
        return tar.extractfile(name).read().decode()


def summary(template, name: str, step_ms: float, batch: int = 1, depth: str = "2+4", **top) -> dict:
    """A real summary with its step median, batch and depth set, and top-level keys (sdpa_kernel, ...) changed."""
    d = json.loads(_member(f"{template}/summary.json"))
    steps = [step_ms] * 8
    d["run_name"], d["per_step"]["step_ms"], d["metrics"]["step_ms"] = name, steps, stats(steps)
    d["config"]["data"]["batch_size"] = batch
    d["config"]["model"]["double_blocks"], d["config"]["model"]["single_blocks"] = map(int, depth.split("+"))
    for k, v in top.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return d


def put(root, name: str, d: dict, age: int = 50):
    p = root / name / "summary.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(d))
    os.utime(p, (2_000_000_000 - age, 2_000_000_000 - age))
    return d


def predicted(d: dict, W: int):
    """What the report must use for a simulated rank: its ledger priced and placed by flux_cp.predict.step_model."""
    return predict_ledger(d["comm"]["ledger"], links.for_world(LINK, W), step_ms=d["metrics"]["step_ms"]["median"])


def no_sigterm(d: dict) -> dict:  # a summary from before --sigterm-every: stock Lightning, every step
    d["config"]["run"].pop("sigterm_every")
    return d


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("regimes")
    sims, pred = {}, {}
    for (batch, depth, W), ms in SIM_MS.items():
        kern = {"sdpa_kernel": "flash"} if W == 2 else {}  # W=8: an older summary, the kernel from sdpa_backend
        d = put(root, f"sim-b{batch}-{depth}-w{W}", summary(SIM[W], f"sim-b{batch}-{depth}-w{W}", ms, batch, depth,
                                                          **kern))
        sims[batch, depth, W], pred[batch, depth, W] = d, predicted(d, W)
    # an older W=2 run of the same regime, far slower: the latest is used
    put(root, "sim-b1-old", summary(SIM[2], "sim-b1-old", 300.0, 1, sdpa_kernel="flash"), age=500)
    base = {}
    for (batch, kind), x in TARGET.items():
        ms = x * pred[batch, "2+4", 2].predicted_ms
        name = f"w1-b{batch}-{kind}"
        if kind == "ring":
            d = summary(RING_W1, name, ms, batch, sdpa_kernel="flash")
        elif kind == "auto":  # an older summary: no sdpa_kernel, the setting auto
            d = summary(NONE_W1, name, ms, batch, sdpa_kernel=None)
        else:
            d = summary(NONE_W1, name, ms, batch, sdpa_kernel=kind)
            if kind == "flash":
                d["config"]["run"]["sdpa_backend"] = d["sdpa_backend"] = "flash"
        base[batch, kind] = put(root, name, d)
    # depth 6 + 12: a baseline and W=8 only: incomplete
    base["deep"] = put(root, "w1-deep", summary(NONE_W1, "w1-deep", 200.0, 1, "6+12", sdpa_kernel="cudnn"))
    # Lightning: stock (no sigterm_every: every step) at W=1 and W=2, paired; a W=2 at every 100 steps has no W=1
    lit = put(root, "lit-w1", no_sigterm(summary(NONE_W1_LIT, "lit-w1", 150.0, sdpa_kernel="cudnn")))
    lit2 = put(root, "lit-w2", no_sigterm(summary(SIM_LIT[2], "lit-w2", 95.0, sdpa_kernel="flash")))
    put(root, "lit-w2-every100", summary(SIM_LIT[2], "lit-w2-every100", 95.0, sdpa_kernel="flash"))
    # W=4 on 4 real processes (measured: 1.06x the W=2 speedup) and as a simulated rank (predicted: far more); the
    # regime's W=4 speedup is the measured one
    put(root, "lit-w4-sim", no_sigterm(summary(SIM_LIT[4], "lit-w4-sim", 55.0, sdpa_kernel="flash")))
    real = no_sigterm(summary(SIM_LIT[4], "lit-w4-real", 90.0, sdpa_kernel="flash"))
    real |= {"simulate_world": None, "simulate": None, "collectives": "real", "world_size": 4, "loss": [1.0] * 8}
    real["config"]["run"] |= {"simulate_world": None, "devices": 4}
    put(root, "lit-w4-real", real)
    # never a cell: another model at W=1, and W=2 runs that are not the user's configuration
    odd = summary(NONE_W1, "w1-heads8", 50.0, 1, sdpa_kernel="cudnn")
    odd["config"]["model"]["num_heads"] = 8
    put(root, "w1-heads8", odd)
    alltoall = summary(SIM[2], "sim-alltoall", 60.0, 1)
    alltoall["config"]["run"]["rotate"] = "alltoall"
    put(root, "sim-alltoall", alltoall)
    ulysses = summary(SIM[2], "sim-ulysses", 60.0, 1)
    ulysses["cp"] = ulysses["config"]["run"]["cp"] = "ulysses"
    put(root, "sim-ulysses", ulysses)
    report = build(root, link=LINK)
    paths = write_report(report, root / "report")
    return {"root": root, "report": report, "json": json.loads(paths["json"].read_text()),
            "md": paths["md"].read_text(), "html": paths["html"].read_text(), "sims": sims, "pred": pred,
            "base": base, "lit": (lit, lit2)}


def regimes_section(md: str) -> str:
    start = md.index("## Regimes")
    return md[start:md.index("\n## ", start)]


def cells(built, basis: str = "predicted") -> dict:
    return {(c["regime"], c["W"]): c for c in built["json"]["regimes"] if c["basis"] == basis}


def test_every_expected_cell_and_no_other(built):
    expected = {(rid(k, b), W) for b, kinds in ((1, (CUDNN, FLASH, RING)), (4, (CUDNN, FLASH, AUTO)))
                for k in kinds for W in (2, 8)}
    expected |= {(rid(CUDNN, 1, "6+12"), 8), (rid(CUDNN, 1, sync="lightning (SIGTERM sync every step)"), 2)}
    got = cells(built)
    lit = rid(CUDNN, 1, sync="lightning (SIGTERM sync every step)")
    assert len(built["json"]["regimes"]) == 16 and set(got) == expected | {(lit, 4)}
    assert set(cells(built, "measured")) == {(lit, 4)}
    # no W=1 ring baseline at batch 4: that regime is absent, not empty
    assert rid(RING, 4) not in built["json"]["regime_summary"]
    # the every-100-steps Lightning run is not paired with the every-step baseline: listed as unpaired
    (u,) = built["json"]["regime_unpaired"]
    assert u["run"] == "lit-w2-every100" and u["lightning_sync"] == "lightning (sync every 100)"
    for c in got.values():
        assert c["run"] not in ("sim-alltoall", "sim-ulysses", "sim-b1-old", "lit-w2-every100")
        assert c["baseline"]["run"] != "w1-heads8"
        assert set(c) >= {"regime", "baseline", "batch", "depth", "compile", "harness", "lightning_sync", "W",
                          "step_ms", "baseline_step_ms", "predicted_step_ms", "speedup", "speedup_bounds", "verdict",
                          "reason", "mechanism", "run"}
        assert set(c["baseline"]) >= {"kind", "sdpa_kernel", "cp", "run"}


def test_speedups_are_the_baseline_over_the_prediction(built):
    got = cells(built)
    for (batch, kind), x in TARGET.items():
        label = {"cudnn": CUDNN, "flash": FLASH, "ring": RING, "auto": AUTO}[kind]
        b = built["base"][batch, kind]
        t1 = b["metrics"]["step_ms"]["median"]
        for W in (2, 8):
            c, p, d = got[rid(label, batch), W], built["pred"][batch, "2+4", W], built["sims"][batch, "2+4", W]
            assert c["run"] == d["run_name"] and c["baseline"]["run"] == b["run_name"]
            assert c["batch"] == batch and c["depth"] == "2+4" and c["compile"] == "eager" and c["harness"] == "bare"
            assert c["step_ms"] == d["metrics"]["step_ms"]["median"] and c["baseline_step_ms"] == t1
            assert c["predicted_step_ms"] == pytest.approx(p.predicted_ms, rel=1e-12)
            assert c["speedup"] == pytest.approx(t1 / p.predicted_ms, rel=1e-12)
            assert c["speedup_bounds"] == pytest.approx([t1 / p.upper_ms, t1 / p.lower_ms], rel=1e-12)
            assert c["basis"] == "predicted" and c["link"] == LINK.name
        assert got[rid(label, batch), 2]["speedup"] == pytest.approx(x, rel=1e-9)  # the target set above
    lit, lit2 = built["lit"]
    c = got[rid(CUDNN, 1, sync="lightning (SIGTERM sync every step)"), 2]
    assert c["speedup"] == pytest.approx(150.0 / predicted(lit2, 2).predicted_ms, rel=1e-12)
    assert c["device_busy_ms"] == lit2["metrics"]["device_busy_ms"]["median"]
    assert f"busy {c['device_busy_ms']:.3g} ms" in c["mechanism"]
    real = cells(built, "measured")[rid(CUDNN, 1, sync="lightning (SIGTERM sync every step)"), 4]
    assert real["run"] == "lit-w4-real" and real["predicted_step_ms"] == real["step_ms"] == 90.0
    assert real["speedup"] == pytest.approx(150.0 / 90.0, rel=1e-12) and real["speedup_bounds"] == [None, None]


def test_verdicts_come_from_the_runs(built):
    s = built["json"]["regime_summary"]
    ok = s[rid(CUDNN, 1)]  # 1.66x at W=2, W=8 adds under 25%
    assert ok["verdict"] == "reproduces" and ok["reason"].startswith("W=2 1.66x, within 10% of 1.66x; W=8 adds")
    assert ok["speedups"]["8"] / ok["speedups"]["2"] < 1.25
    assert s[rid(FLASH, 1)]["verdict"] == "does not reproduce"
    assert s[rid(FLASH, 1)]["reason"].startswith("W=2 1.00x, far below 1.66x")
    assert s[rid(RING, 1)]["verdict"] == "does not reproduce" and "W=2 1.20x, far below" in s[rid(RING, 1)]["reason"]
    keeps = s[rid(CUDNN, 4)]  # 1.70x at W=2, in the band, but W=8 keeps gaining
    gain = keeps["speedups"]["8"] / keeps["speedups"]["2"] - 1
    assert keeps["verdict"] == "does not reproduce" and gain > 0.25
    assert keeps["reason"] == f"W=8 adds {gain:.0%} over W=2 ({keeps['speedups']['8']:.2f}x)"
    assert "W=2 2.20x, far above 1.66x" in s[rid(FLASH, 4)]["reason"]
    assert s[rid(CUDNN, 1, "6+12")]["verdict"] == "incomplete" and "no W=2 run" in s[rid(CUDNN, 1, "6+12")]["reason"]
    lit = s[rid(CUDNN, 1, sync="lightning (SIGTERM sync every step)")]  # W=4 measured, not the simulated rank's
    assert lit["basis"] == {"2": "predicted", "4": "measured"} and lit["speedups"]["4"] == pytest.approx(150.0 / 90.0)
    assert lit["verdict"] == "reproduces", lit["reason"]
    for r in s.values():  # every cell carries its regime's verdict; speedups by W from the cells
        mine = [c for c in built["json"]["regimes"] if c["baseline"] == r["baseline"] and c["batch"] == r["batch"]
                and c["depth"] == r["depth"] and c["lightning_sync"] == r["lightning_sync"]]
        assert {str(c["W"]): c["speedup"] for c in mine if c["basis"] == r["basis"][str(c["W"])]} == r["speedups"]
        assert all(c["verdict"] == r["verdict"] and c["reason"] == r["reason"] for c in mine)
        assert r["mechanism"].startswith(r["baseline"]["kind"]) and "W=1 step" in r["mechanism"]


def section(md: str, head: str) -> str:
    start = md.index(head)
    return md[start:md.index("\n## ", start + 1)]


def test_one_voice_the_verdict_the_regime_table_and_the_reconciliation(built):
    """Issue 40: the report opens with the regime table's verdict (the regime that reproduces the 1.66x), and the
    reconciliation divides by that regime's W=1 step and states the table's speedups, not a figure of its own."""
    j, md = built["json"], built["md"]
    h, summary = j["headline"], j["regime_summary"]
    first = rid(CUDNN, 1)  # the first regime of the table that reproduces (the Lightning one, row 8, does too)
    assert (h["source"], h["regime"], h["number"], h["why"]) == ("regimes", first, 1, "reproduces")
    s = summary[first]
    assert h["speedups"] == s["speedups"] and h["verdict"] == s["verdict"] == "reproduces"
    assert [x["regime"] for x in h["reproducing"]] == [rid(CUDNN, 1, sync="lightning (SIGTERM sync every step)")]
    rec = j["reconcile"]
    assert rec["baseline"]["regime"] == first and rec["baseline"]["run"] == s["baseline"]["run"] == "w1-b1-cudnn"
    assert rec["baseline_ms"] == s["baseline"]["step_ms"]
    assert {str(r["W"]): r["speedup"] for r in rec["rows"]} == s["speedups"]
    for r in rec["rows"]:  # the regime's cells, priced the same way: the same numbers
        cell = next(c for c in j["regimes"] if c["regime"] == first and c["W"] == r["W"])
        assert r["run"] == cell["run"] and r["predicted_speedup"] == pytest.approx(cell["speedup"], rel=1e-12)
    # the markdown: the opening, the table's row 1 and the reconciliation print the same figure and name regime 1
    w2 = f"{s['speedups']['2']:.2f}x"
    opening, table, recon = section(md, "## Verdict"), regimes_section(md), section(md, "## Reconciling")
    assert "reproduced by regime 1** of the [regime table](#regimes)" in opening and f"{w2} at W=2" in opening
    assert f"| 1 | {w2} (" in table and "| 1 | plain W=1, cudnn (*), " in table
    assert "divides by the W=1 step of regime 1 of the regime table, plain W=1, cudnn (w1-b1-cudnn" in recon
    assert f"{w2} at W=2" in recon and "from the prediction" not in recon
    # what to run: the opening's pick is the regime table's, with the command that runs it
    for w, b in h["best"].items():
        assert b["run"] == s["best"][w]["run"] and b["speedup"] == s["best"][w]["speedup"]
        assert b["command"].startswith("python scripts/train_bench.py ") and b["command"].endswith(f"--devices {w}")
        assert f"`{b['command']}`" in opening
    assert h["best"]["2"]["speedup"] > s["speedups"]["2"] and "**pays**" in opening


def test_tables_are_narrow_and_report_json_keeps_every_column(built):
    """Issue 38: no table in report.md or report.html wider than 8 columns; report.json keeps what the wide regime
    and lever tables showed."""
    assert_narrow(built["md"], built["html"])
    for s in built["json"]["regime_summary"].values():
        assert {"baseline", "batch", "depth", "compile", "lightning_sync", "host", "host_op_us", "speedups", "bounds",
                "basis", "verdict", "reason", "mechanism", "kernel_note"} <= set(s)
        assert {"kind", "sdpa_kernel", "step_ms", "run"} <= set(s["baseline"])
    assert built["json"]["levers"]
    for r in built["json"]["levers"]:
        assert {"lever", "strategy", "build", "W", "before", "after", "step_ms", "predicted_step_ms", "change_pct",
                "exposed_comm_ms", "peak_gib", "basis", "suite", "before_run", "after_run"} <= set(r)
    for c in built["json"]["configurations"]:  # each titled by what it is, its id an anchor
        assert f'<a id="{c["id"]}"></a>' in built["md"] and f"## {c['id']}:" not in built["md"]


def test_no_regime_reproduces_the_verdict_names_the_closest(tmp_path):
    """The issue's case: the plain cuDNN W=1 step gives 1.08x at W=2, the user's own W=1 step (context_parallel at
    world size 1) 1.41x; none reproduces. The verdict says so and names the closest (the ring's, 1.41x); the
    reconciliation divides by that regime's W=1 step and says 1.41x too, never 1.08x or a 1.66x verdict of its own."""
    ring = put(tmp_path, "ring-w2", summary(SIM[2], "ring-w2", 80.0, sdpa_kernel="flash"))
    p = predicted(ring, 2).predicted_ms
    put(tmp_path, "w1-cudnn", summary(NONE_W1, "w1-cudnn", 1.08 * p, sdpa_kernel="cudnn"))
    put(tmp_path, "w1-ring", summary(RING_W1, "w1-ring", 1.41 * p, sdpa_kernel="flash"))
    report = build(tmp_path, link=LINK)
    md = write_report(report, tmp_path / "report")["md"].read_text()
    j = json.loads((tmp_path / "report" / "report.json").read_text())
    h, summ = j["headline"], j["regime_summary"]
    assert {s["verdict"] for s in summ.values()} == {"does not reproduce"}
    assert (h["regime"], h["why"]) == (rid(RING, 1), "closest") and h["speedups"]["2"] == pytest.approx(1.41)
    n = h["number"]
    opening, recon = section(md, "## Verdict"), section(md, "## Reconciling")
    assert f"**not reproduced by any regime** (2 does not reproduce); the closest at W=2 is regime {n}" in opening
    assert "1.41x at W=2" in opening and f"against its W=1 step, {RING} (w1-ring" in opening
    rec = j["reconcile"]
    assert rec["baseline"]["run"] == "w1-ring" and rec["baseline"]["regime"] == h["regime"]
    assert [r["speedup"] for r in rec["rows"]] == [summ[h["regime"]]["speedups"]["2"]]
    assert f"divides by the W=1 step of regime {n} of the regime table, {RING} (w1-ring" in recon
    assert "1.41x at W=2" in recon and "1.08x at W=2" not in recon and "from the prediction" not in recon
    assert "no regime reproduces the 1.66x; this one is the closest at W=2" in recon


def test_a_regime_on_two_gpu_kinds_says_what_holds_and_what_differs(tmp_path):
    """Issue 40's case: the same regime (the ring at world size 1 as W=1, batch 1) on an H200 lease, where W=2 gives
    1.60x and W=8 little more, and on an H100 lease, where W=2 gives 1.41x: report.json pairs the two devices, the
    verdict holds on neither pair as one, and report.md says which device reproduces and which does not."""
    for dev, w1 in (("NVIDIA H200", 1.60), ("NVIDIA H100 80GB HBM3", 1.41)):
        tag = dev.split()[1]
        runs = {W: summary(SIM[W], f"ring-w{W}-{tag}", ms, sdpa_kernel="flash") for W, ms in ((2, 75.0), (8, 70.0))}
        for d in runs.values():
            d["env"]["device"] = dev
            put(tmp_path, d["run_name"], d)
        base = summary(RING_W1, f"w1-ring-{tag}", w1 * predicted(runs[2], 2).predicted_ms, sdpa_kernel="flash")
        base["env"]["device"] = dev
        put(tmp_path, base["run_name"], base)
    report = build(tmp_path, link=LINK)
    paths = write_report(report, tmp_path / "report")
    md = paths["md"].read_text()
    j = json.loads((tmp_path / "report" / "report.json").read_text())
    (a,) = j["regime_across_devices"]
    by = {r["device"]: r for r in a["devices"]}
    assert set(by) == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"} and not a["holds"]
    assert by["NVIDIA H100 80GB HBM3"]["speedups"]["2"] == pytest.approx(1.41)
    assert by["NVIDIA H200"]["speedups"]["2"] == pytest.approx(1.60)
    assert by["NVIDIA H200"]["verdict"] != by["NVIDIA H100 80GB HBM3"]["verdict"]
    assert "### Across GPU kinds" in md and "H100 80GB HBM3: does not reproduce (W=2 1.41x)" in md
    assert "- **1. differs** (" in md and "H200: reproduces" in md
    assert_narrow(md, paths["html"].read_text())


def test_a_bare_loop_names_host_bound_time_only_where_it_records_it(tmp_path):
    """Issue 40: a bare loop that records no device busy time says "host-bound share not recorded" (never files host
    time as compute); one whose summaries carry device_busy_ms has its host-bound time named host-bound."""
    def runs(folder, busy: dict | None):
        ring = summary(SIM[2], "ring-w2", 80.0, sdpa_kernel="flash")
        base = summary(NONE_W1, "w1", 120.0, sdpa_kernel="flash")
        for d, frac in ((ring, (busy or {}).get(2)), (base, (busy or {}).get(1))):
            if frac is not None:
                vals = [frac * d["metrics"]["step_ms"]["median"]] * 8
                d["metrics"]["device_busy_ms"], d["per_step"]["device_busy_ms"] = stats(vals), vals
        put(tmp_path / folder, "ring-w2", ring)
        put(tmp_path / folder, "w1", base)
        report = build(tmp_path / folder, link=LINK)
        write_report(report, tmp_path / folder / "report")
        (s,) = report.regimes["summary"].values()
        return s, report.reconcile, (tmp_path / folder / "report" / "report.md").read_text()

    s, rec, md = runs("unrecorded", None)
    assert "host-bound share not recorded" in s["mechanism"] and "host-bound (device idle)" not in s["mechanism"]
    assert "non-scaling compute or host-bound (host-bound share not recorded" in s["mechanism"]
    (r,) = rec["rows"]
    assert not r["split"]["host"] and "| not recorded |" in section(md, "## Reconciling")
    s, rec, md = runs("recorded", {1: 0.95, 2: 0.5})
    (r,) = rec["rows"]
    assert r["split"]["host"] and r["waterfall_ms"]["host-bound"] > 0
    assert r["waterfall_ms"]["host-bound"] == pytest.approx(0.5 * 80.0 - 0.05 * 120.0 / 2)
    assert "host-bound (device idle)" in s["mechanism"] and "not recorded" not in s["mechanism"]
    assert "rank's device is busy 40 ms of its 80 ms step" in s["mechanism"] and ": host-bound;" in s["mechanism"]
    assert "host-bound share not recorded" not in section(md, "## Reconciling")


def test_a_baseline_of_another_kernel_says_so(built):
    got = cells(built)
    for (regime, _), c in got.items():
        kern = c["baseline"]["sdpa_kernel"]
        assert c["sdpa_kernel"] == "flash"  # W=2: sdpa_kernel; W=8: an older summary, the ring's pinned backend
        if kern == "cudnn":
            assert c["kernel_note"].startswith("baseline SDPA kernel cudnn, the ring's flash")
        elif kern == "auto":
            assert "not recorded" in c["kernel_note"]
        else:
            assert c["kernel_note"] is None, regime
    assert got[rid(AUTO, 4), 2]["baseline"]["kind"] == AUTO  # no sdpa_kernel, setting auto: labelled auto
    assert got[rid(RING, 1), 2]["baseline"]["cp"] == "torch"
    md = regimes_section(built["md"])
    rows = {ln.split(" | ")[1]: ln for ln in md.splitlines() if ln.startswith("| ") and "ms | " in ln}
    assert len(rows) == len(built["json"]["regime_summary"])
    assert all(("(*)" in k) == k.startswith(CUDNN) for k in rows) and any(k.startswith(AUTO + " (?)") for k in rows)
    assert "pair a W >= 2 ring run (the ring pins flash) with a W=1 baseline of another SDPA kernel" in md
    cudnn_rows = ", ".join(str(i) for i, r in enumerate(built["json"]["regime_summary"].values(), 1)
                           if r["baseline"]["sdpa_kernel"] == "cudnn")
    assert f"- baseline SDPA kernel cudnn, the ring's flash: the speedup includes the change of kernel, not only the " \
           f"split (rows {cudnn_rows})" in md


def test_markdown_figure_and_cli(built, capsys):
    assert built["json"]["regime_across_devices"] == [] and "Across GPU kinds" not in built["md"]  # one device
    md, out = built["md"], built["root"] / "report"
    assert "## Regimes: which W=1 baseline and which work per step give 1.66x" in md
    assert "## Reconciling the 1.66x" in md
    # the verdict, the method, the regimes, then the reconciliation of the regime the verdict names
    assert md.index("## Verdict") < md.index("## Method") < md.index("## Regimes") < md.index("## Reconciling")
    assert "![regimes](regimes.png)" in md and (out / "regimes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    s = built["json"]["regime_summary"]
    c = s[rid(CUDNN, 1)]
    assert f"| {c['speedups']['2']:.2f}x ({c['bounds']['2'][0]:.2f}-{c['bounds']['2'][1]:.2f}) |" in md
    lines = regime_lines(built["report"])
    assert len(lines) == len(s) and all(f"{v['verdict']} ({v['reason']})" in ln for ln, v in zip(lines, s.values()))
    spec = importlib.util.spec_from_file_location("report_cli", ROOT / "scripts" / "report.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main([str(built["root"]), "--out", str(built["root"] / "cli"), "--wandb-mode", "disabled"]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("report.py: regime ")]
    assert printed == [f"report.py: {ln}" for ln in lines]


@pytest.mark.parametrize("speedups,want", [({2: 1.4941}, "reproduces"), ({2: 1.4939}, "does not reproduce"),
                                          ({2: 1.8259}, "reproduces"), ({2: 1.8261}, "does not reproduce"),
                                          ({2: 1.66, 8: 1.66 * 1.249}, "reproduces"),
                                          ({2: 1.66, 4: 1.66 * 1.25}, "does not reproduce"),
                                          ({2: 1.66, 8: 0.9}, "reproduces"), ({4: 1.66, 8: 1.7}, "incomplete")])
def test_verdict_bounds(speedups, want):
    assert verdict(speedups)[0] == want


def test_repeats_give_their_median_run_and_a_slowed_host_its_own_regime(tmp_path):
    """Three repeats of one W=2 cell (50, 60, 90 ms): the cell is the median run, its spread noted; the same cell on
    an emulated half-speed host (--host-slowdown 2) is another regime, paired with a baseline of that host only."""
    for i, ms in enumerate((90.0, 50.0, 60.0)):
        d = summary(SIM[2], f"rep{i}", ms, sdpa_kernel="flash")
        d["config"]["data"]["seed"] = i
        put(tmp_path, f"rep{i}", d, age=10 * i)
    put(tmp_path, "w1", summary(NONE_W1, "w1", 120.0, sdpa_kernel="flash"))
    for name, ms, src in (("slow-w1", 125.0, NONE_W1), ("slow-w2", 100.0, SIM[2])):
        d = summary(src, name, ms, sdpa_kernel="flash")
        d["config"]["run"]["host_slowdown"] = 2
        put(tmp_path, name, d)
    reg = build(tmp_path, link=LINK).regimes
    summ = reg["summary"]
    assert set(summ) == {rid("plain W=1, flash", 1), rid("plain W=1, flash", 1) + " | host 1/2 (emulated)"}
    fast = [c for c in reg["cells"] if c["host"] == "host as is"]
    slow = [c for c in reg["cells"] if c["host"] != "host as is"]
    assert [c["run"] for c in fast] == ["rep2"] and fast[0]["step_ms"] == 60.0 and fast[0]["baseline_step_ms"] == 120
    assert any(n.startswith("W=2 (predicted): median of 3 runs (50-90 ms)") for n in summ[fast[0]["regime"]]["notes"])
    assert [c["run"] for c in slow] == ["slow-w2"] and slow[0]["baseline_step_ms"] == 125.0


def test_a_reproducing_regime_names_the_fastest_configuration_at_each_w(tmp_path):
    """Issue 24's "what the user should do": in a regime that reproduces 1.66x, the fastest configuration run on the
    same device, model, data, host and harness (any strategy), at each W, with its speedup over the regime's
    baseline; a configuration of another batch never stands in."""
    ring = put(tmp_path, "ring-w2", summary(SIM[2], "ring-w2", 80.0, sdpa_kernel="flash"))
    base_ms = 1.66 * predicted(ring, 2).predicted_ms
    put(tmp_path, "w1", summary(NONE_W1, "w1", base_ms, sdpa_kernel="flash"))
    uly = summary(SIM[2], "uly-w2", 50.0, sdpa_kernel="cudnn")
    uly["cp"] = uly["config"]["run"]["cp"] = "ulysses"
    uly["memory"] = {"allocated_gib": 41.25, "reserved_gib": 44.0}  # the rank's peak, beside its speedup
    put(tmp_path, "uly-w2", uly)
    other = summary(SIM[2], "uly-b4-w2", 20.0, batch=4, sdpa_kernel="cudnn")  # faster, but another batch
    other["cp"] = other["config"]["run"]["cp"] = "ulysses"
    put(tmp_path, "uly-b4-w2", other)
    report = build(tmp_path, link=LINK)
    (s,) = [s for s in report.regimes["summary"].values() if s["verdict"] == "reproduces"]
    b = s["best"]["2"]
    assert b["run"] == "uly-w2" and b["strategy"].startswith("ulysses") and b["basis"] == "predicted" and not b["users"]
    assert b["speedup"] == pytest.approx(base_ms / predicted(uly, 2).predicted_ms, rel=1e-9)
    assert b["recipe"] == "configs/recipes/ulysses_ddp.yaml"  # its settings (ulysses, DDP, eager, bf16) are that file's
    assert recipe_for(ring["config"]["run"]) is None  # no recipe is the user's ring
    assert b["peak_gib"] == 41.25
    assert any("what to run: W=2 ulysses" in line and "peak 41.2 GiB per rank" in line for line in regime_lines(report))


def test_levers_pair_runs_of_one_call_that_differ_in_one_lever(tmp_path):
    """Issue 26's before/after (flux_cp/report/levers.py): in one suite's folder, runs that differ only in a lever's
    settings make a row at their W, the lever's default the "before", repeats their median run, each step the report's
    own prediction; runs of another folder (another call) or differing in a second setting make none."""
    def run(folder, name, W, ms, **settings):
        d = summary(SIM[W], name, ms)
        d["config"]["run"] |= settings
        return put(tmp_path / folder, name, d)

    off = {W: run("call1", f"off-w{W}", W, 40.0) for W in (2, 8)}
    on = {2: [run("call1", f"on-w2-{i}", 2, ms, ulysses_overlap=True) for i, ms in enumerate((36.0, 30.0, 38.0))],
          8: [run("call1", "on-w8", 8, 33.0, ulysses_overlap=True)]}
    run("call1", "on-w8-autotune", 8, 20.0, ulysses_overlap=True, compile_mode="max-autotune-no-cudagraphs")
    run("call2", "on-w2-later", 2, 10.0, ulysses_overlap=True)  # another call: no pair with call1's
    report = build(tmp_path, link=LINK)
    rows = [r for r in report.levers["rows"] if r["lever"] == "all-to-alls under the MLP"]
    assert [(r["W"], r["before_run"], r["after_run"], r["suite"]) for r in rows] == [
        (2, "off-w2", "on-w2-0", "call1"), (8, "off-w8", "on-w8", "call1")]  # on-w2-0: the median of 36, 30, 38
    for r in rows:
        W = r["W"]
        after = next(d for d in on[W] if d["run_name"] == r["after_run"])
        want = [predicted(off[W], W).predicted_ms, predicted(after, W).predicted_ms]
        assert r["predicted_step_ms"] == pytest.approx(want, rel=1e-9) and r["step_ms"] == [40.0, after["metrics"][
            "step_ms"]["median"]]
        assert r["exposed_comm_ms"] == pytest.approx([predicted(off[W], W).exposed_ms, predicted(after, W).exposed_ms])
        assert (r["before"], r["after"], r["basis"]) == (False, True, "predicted")
        assert r["change_pct"] == pytest.approx(100 * (want[1] / want[0] - 1))
    # the autotuned run pairs with its own mode's twin (compile mode, both overlapped), not with the blocking run
    (mode,) = [r for r in report.levers["rows"] if r["lever"] == "compile mode"]
    assert (mode["before_run"], mode["after_run"], mode["after"]) == ("on-w8", "on-w8-autotune",
                                                                      "max-autotune-no-cudagraphs")
    md = (write_report(report, tmp_path / "out")["md"]).read_text()
    assert "## Levers: one setting changed, in one call" in md and "| all-to-alls under the MLP |" in md
