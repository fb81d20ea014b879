"""The report on real CPU runs (W=1 none, W=2 allgather-kv) plus ops-mode summaries built to the
ops format: its numbers equal those computed from the summaries, figures and HTML are valid,
bad runs are listed rather than fatal, and bad input fails with one line. Its reading of profiles and ledgers, and
its verdicts: test_report_ledger.py."""

import base64
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from flux_cp.predict import links
from flux_cp.predict.step_model import approximate_ledger, predict, predict_ledger
from flux_cp.report import OPS
from flux_cp.runs.results import validate

from .conftest import ROOT, write

REPORT = ROOT / "scripts" / "report.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ISO = {1: {"sdpa_fwd": 0.40, "sdpa_bwd": 1.20, "qkv_gemm_fwd": 0.30, "qkv_gemm_bwd": 0.60},  # per call, ms
       2: {"sdpa_fwd": 0.38, "sdpa_bwd": 1.10, "qkv_gemm_fwd": 0.16, "qkv_gemm_bwd": 0.31}}


# a CPU link profile as tools/measure_links.py writes one (hand-made: fixed numbers)
CPU_LINK = {"name": "cpu-test", "measured": True, "kinds": {k: {"latency_us": 50.0, "busbw_gbps": 1.0, "source": "test"}
                                                            for k in ("all_reduce", "all_gather", "reduce_scatter",
                                                                      "all_to_all", "broadcast", "send")}}


def expected_prediction(d, W, link):
    """What the report must show: the run's ledger (or the one derived from its shapes) through predict.py."""
    step = d["metrics"]["step_ms"]["median"]
    if (d.get("comm") or {}).get("ledger"):
        return predict_ledger(d["comm"]["ledger"], link, step_ms=step)
    return predict(*approximate_ledger(d, W, step_ms=step), link)


def table_widths(md: str, html: str) -> list[int]:
    """The number of columns of every table row in report.md (cells between unescaped bars) and of every header
    and data row in report.html."""
    widths = [len(re.split(r"(?<!\\)\|", ln.strip())) - 2 for ln in md.splitlines() if ln.lstrip().startswith("|")]
    widths += [len(re.findall(r"<t[hd][ >]", tr)) for tr in re.findall(r"<tr>(.*?)</tr>", html, re.S)]
    return widths


def assert_narrow(md: str, html: str):
    """Issue 38: no table in report.md or report.html wider than 8 columns (a wider one is split)."""
    widths = table_widths(md, html)
    assert widths and max(widths) <= 8, sorted(set(widths))


def report_cli(*args):
    env = {**os.environ, "WANDB_SILENT": "true"}
    return subprocess.run([sys.executable, str(REPORT), *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)


def st(v):
    return {"median": v, "min": v, "max": v, "n": 5}


def ops_summary(train: dict, world: int, cp: str) -> dict:
    """An ops-mode summary.json as the ops format specifies, for the train run's model and device."""
    d = {k: copy.deepcopy(train[k]) for k in ("schema", "group", "config", "env", "params", "sdpa_backend")}
    ms = ISO[world]
    d |= {"mode": "ops", "run_name": f"ops-W{world}-{cp}-s144", "world_size": world, "cp": cp,
          "simulate_world": None, "loss": [], "complete": True, "peak_tflops": None}
    d["metrics"] = {f"{op}_ms": st(v) for op, v in ms.items()} | {f"{op}_host_ms": st(v / 2) for op, v in ms.items()}
    row = {"seq_len": 144, "world": world, "simulated": False, "cp": cp, "graph": False, "sdpa_backend": "auto",
           "shape": "(1, 4, 144, 16)", "flops": 1e6, "tflops": 1.0}
    # the seed-compat rows carry other figures: the report must prefer the corrected method
    d["ops"] = [{**row, "op": op, "method": m, "device_ms": st(v * (1 if m == "corrected" else 7)),
                 "host_ms": st(v / 2) if m == "corrected" else None}  # the seed's loop has no per-call host time
                for op, v in ms.items() for m in ("seed-compat", "corrected")]
    d["ops"].append({**row, "op": "gemm_peak", "method": "corrected", "device_ms": st(1.0), "host_ms": None})
    return d


@pytest.fixture(scope="module")
def built(train_runs, tmp_path_factory):
    """RUNS_DIR with the real runs, ops runs, a mismatched config and bad files; the CLI run once on it."""
    root = tmp_path_factory.mktemp("runs")
    t = {w: json.loads(p.read_text()) for w, p in train_runs.items()}
    for w, p in train_runs.items():
        shutil.copy(p, root / f"train-w{w}.json")  # not named summary.json: must not be found
        write(root / "sweep" / f"train-w{w}" / "summary.json", p.read_text())
    shutil.copytree(train_runs["sim"].parent, root / "sim")  # a duplicate simulated run: the latest is used
    for w, cp in ((1, "none"), (2, "allgather-kv")):
        write(root / "ops" / f"w{w}" / "summary.json", ops_summary(t[1], w, cp))
    odd = copy.deepcopy(t[2])  # another model: its own configuration, with no W=1 baseline
    odd["config"]["model"]["num_heads"] = 8
    odd["run_name"] = "train-W2-heads8"
    write(root / "odd" / "summary.json", odd)
    write(root / "bad" / "corrupt" / "summary.json", '{"schema": 1, "mode": "tr')
    write(root / "bad" / "schema" / "summary.json", {"schema": 1, "mode": "train"})
    write(root / "bad" / "partial" / "summary.json", {**t[2], "complete": False, "error": "RuntimeError: boom"})
    out = root / "out"
    write(root.parent / f"{root.name}-cpu-link.yaml", json.dumps(CPU_LINK))  # YAML is a superset of JSON
    out.mkdir()
    (out / "c9_ops.png").write_bytes(b"stale")  # an earlier report's figure: removed
    (out / "mine.png").write_bytes(b"keep")  # not the report's: kept
    r = report_cli(root, "--out", out, "--wandb-mode", "offline", "--wandb-report", "--cpu-link",
                   root.parent / f"{root.name}-cpu-link.yaml", "--reconcile", "allgather-kv")
    return {"root": root, "out": out, "cli": r, "t": t, "json": json.loads((out / "report.json").read_text()),
            "md": (out / "report.md").read_text()}


def _config(rep, heads, strategy="allgather-kv"):
    (c,) = [c for c in rep["configurations"] if c["key"]["heads"] == heads and c["strategy"] == strategy]
    return c


def test_ops_summaries_follow_the_contract(built):
    for w in (1, 2):
        assert validate(json.loads((built["root"] / "ops" / f"w{w}" / "summary.json").read_text())) == []


def test_numbers_equal_those_from_the_summaries(built):
    assert built["cli"].returncode == 0, built["cli"].stderr
    t1, t2 = built["t"][1], built["t"][2]
    med = lambda d, k: d["metrics"][k]["median"]  # noqa: E731
    c = _config(built["json"], 4)
    assert c["strategy"] == "allgather-kv"
    base, row = c["rows"]
    assert base["baseline"] and base["run"] == t1["run_name"] and row["run"] == t2["run_name"] and row["W"] == 2
    # speedups: step and each op in-step (train runs), isolated (ops runs, corrected method)
    assert row["speedup"]["step"] == pytest.approx(med(t1, "step_ms") / med(t2, "step_ms"), rel=1e-12)
    assert row["loop_ms"] == med(t2, "loop_ms")  # the loop's period, as the user's wall clock sees it
    assert row["speedup"]["loop"] == pytest.approx(med(t1, "loop_ms") / med(t2, "loop_ms"), rel=1e-12)
    for op in OPS:
        assert row["speedup_instep"][op] == pytest.approx(med(t1, f"{op}_ms") / med(t2, f"{op}_ms"), rel=1e-12)
        assert row["speedup_isolated"][op] == pytest.approx(ISO[1][op] / ISO[2][op], rel=1e-12)
        assert row["isolated_call_ms"][op] == ISO[2][op]
        assert row["call_ms"][op] == med(t2, f"{op}_call_ms")
    # shares at W=1: no comm, idle not recorded, other = step - op regions, both of the steps that carried the
    # regions (step_timed_ms: --regions-every 4), so that they never mix two sets of steps
    timed1, step1 = med(t1, "step_timed_ms"), med(t1, "step_ms")
    for op in OPS:
        assert base["shares"][op] == pytest.approx(med(t1, f"{op}_ms") / timed1, rel=1e-9)
    assert base["shares"]["other"] == pytest.approx(1 - sum(med(t1, f"{op}_ms") for op in OPS) / timed1, rel=1e-9)
    k1 = step1 / timed1  # parts in ms of the plain step: the timed steps' split, scaled
    other1 = step1 - k1 * sum(med(t1, f"{op}_ms") for op in OPS)
    assert base["parts_ms"]["comm_kv"] == base["parts_ms"]["comm_grad"] == base["parts_ms"]["idle"] == 0
    assert sum(row["shares"].values()) == pytest.approx(1.0)
    # comm: the run's collectives priced with the CPU profile and placed on its step by predict.py
    p = expected_prediction(t2, 2, links.from_dict(CPU_LINK))
    pred = row["prediction"]
    assert pred["exposed_ms"] == pytest.approx(p.exposed_ms) and pred["priced_ms"] == pytest.approx(p.comm_ms)
    assert row["parts_ms"]["comm_kv"] + row["parts_ms"]["comm_grad"] == pytest.approx(p.exposed_ms)
    assert row["comm_source"].startswith(("byte counts priced with cpu-test", "ledger priced with cpu-test"))
    if not t2.get("comm"):  # derived from the shapes: K, V gathered per block (fp32, 2 + 2 blocks)
        assert pred["bytes_by_kind"]["all_gather"] == 2 * 1 * 4 * 144 * 16 * 4 * 4
    assert row["timer"] == "perf_counter" and row["step_spread_kind"] in ("IQR", "min-max")
    # Amdahl: compute parts at W=2 are the step less its communication (no idle recorded)
    comm = row["parts_ms"]["comm_kv"] + row["parts_ms"]["comm_grad"]
    am = row["amdahl"]
    assert am["predicted_speedup"] == pytest.approx(step1 / (med(t2, "step_ms") - comm), rel=1e-9)
    assert am["residual_ms"] == pytest.approx(comm, rel=1e-6) and am["residual_named"] == "comm" and comm > 0
    iso_pred = sum(k1 * med(t1, f"{op}_ms") * ISO[2][op] / ISO[1][op] for op in OPS) + other1 / 2 + comm
    assert am["isolated_predicted_speedup"] == pytest.approx(step1 / iso_pred, rel=1e-9)
    assert row["verdict"].startswith(f"W=2: {row['speedup']['step']:.2f}x step speedup")
    md = (built["out"] / "report.md").read_text()
    assert f"{row['speedup']['step']:.3g}x" in md and row["verdict"] in md


def test_mismatched_config_is_its_own_group_without_baseline(built):
    c = _config(built["json"], 8)
    assert [r["run"] for r in c["rows"]] == ["train-W2-heads8"]  # never mixed with the heads-4 runs
    assert "no W=1 baseline" in c["notes"][0] and "heads 4 vs 8" in c["notes"][0]
    (row,) = c["rows"]
    assert "speedup" not in row and row["step_ms"] == built["t"][2]["metrics"]["step_ms"]["median"]
    assert "no W=1 baseline" in row["verdict"]


def test_bad_runs_are_listed_not_fatal(built):
    skipped = {s["path"].split("/bad/")[1]: s for s in built["json"]["skipped"]}
    assert set(skipped) == {"corrupt/summary.json", "schema/summary.json", "partial/summary.json"}
    assert skipped["corrupt/summary.json"]["reason"].startswith("unreadable JSON")
    assert skipped["schema/summary.json"]["reason"].startswith("schema mismatch: missing key")
    assert skipped["partial/summary.json"]["status"] == "partial"
    assert "RuntimeError: boom" in skipped["partial/summary.json"]["reason"]
    md = (built["out"] / "report.md").read_text()
    assert "## Skipped and partial runs" in md and "RuntimeError: boom" in md
    assert "partial: " in built["cli"].stderr


def test_figures_are_pngs_and_html_embeds_them(built):
    from PIL import Image

    out = built["out"]
    assert not (out / "c9_ops.png").exists() and (out / "mine.png").read_bytes() == b"keep"  # stale one removed
    pngs = sorted(p for p in out.glob("*.png") if p.name != "mine.png")
    assert {p.name for p in pngs} >= {"c1_breakdown.png", "c1_speedup.png", "c1_ops.png", "c2_breakdown.png",
                                      "reconcile.png"}
    for p in pngs:
        assert p.read_bytes()[:8] == PNG_MAGIC
        with Image.open(p) as im:
            im.verify()

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.imgs, self.tables, self.text = [], 0, []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "img":
                self.imgs.append(a["src"])
            self.tables += tag == "table"

        def handle_data(self, data):
            self.text.append(data)

    page = Page()
    page.feed((out / "report.html").read_text())
    page.close()
    assert len(page.imgs) == len(pngs) and page.tables >= 5
    prefix = "data:image/png;base64,"
    assert all(s.startswith(prefix) for s in page.imgs)  # self-contained: nothing fetched
    assert {base64.b64decode(s[len(prefix):]) for s in page.imgs} == {p.read_bytes() for p in pngs}
    text = "".join(page.text)
    assert "RuntimeError: boom" in text and "Reconciling the 1.66x" in text
    assert "`" not in text and "<code>" in (out / "report.html").read_text()  # the markdown rendered, not quoted


def test_wandb_report_run_offline(built):
    runs = list((built["out"] / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
    assert len(list(runs[0].parent.glob("files/media/images/**/*.png"))) == len(list(built["out"].glob("*.png"))) - 1
    assert "wandb sync" in built["cli"].stderr and "--wandb-mode online --wandb-report" in built["cli"].stderr


def test_tables_are_narrow_and_report_json_keeps_every_column(built):
    """report.md and report.html: every table at most 8 columns; report.json: the fields the wide tables showed
    (a configuration's step table: run, step, spread, speedups, Amdahl, isolated prediction, residual, comm source;
    the reconciliation's: prediction, bounds, basis, measurement, error, waterfall, isolated speedups)."""
    assert_narrow(built["md"], (built["out"] / "report.html").read_text())
    for c in built["json"]["configurations"]:
        for r in c["rows"]:
            assert {"W", "run", "simulated", "rank", "step_ms", "step_spread_ms", "step_spread_kind", "loop_ms",
                    "comm_source", "parts_ms", "shares", "idle_source", "call_ms", "isolated_call_ms",
                    "prediction"} <= set(r)
            if "speedup" in r:
                assert {"projected_step", "loop", "bounds"} <= set(r["speedup"])
                assert {"predicted_speedup", "isolated_predicted_speedup", "residual_ms", "residual",
                        "residual_named"} <= set(r["amdahl"])
                assert {"speedup_instep", "speedup_isolated", "speedup_parts", "noise"} <= set(r)
    for r in built["json"]["reconcile"]["rows"]:
        assert {"W", "predicted_speedup", "bounds", "predicted_ms", "basis", "measured_speedup", "measured_run",
                "error_pct", "waterfall_ms", "isolated", "run"} <= set(r)
    # the sections by what they say: the verdict first, then the method, the sections, each configuration
    md = built["md"]
    assert md.index("## Verdict") < md.index("## Method") < md.index("## Reconciling") < md.index('<a id="c1">')
    assert "## c1" not in md and "[" in md[md.index("## Method"):md.index("## Regimes")]  # titles, ids as anchors
    # no run of the user's ring here: the verdict says the 1.66x is not tested, and names the fastest configuration
    # at W=2 against its own W=1 step, with its command, as the configuration's table states it
    h = built["json"]["headline"]
    assert h["source"] == "configurations" and h["regime"] is None
    opening = md[md.index("## Verdict"):md.index("## Method")]
    assert "**The user's 1.66x at W=2**: not tested" in opening
    b = h["best"]["2"]
    row = next(r for c in built["json"]["configurations"] for r in c["rows"] if r["run"] == b["run"])
    assert b["speedup"] == row["speedup"]["projected_step"] and f"{b['speedup']:.2f}x" in opening
    assert b["command"].startswith("python scripts/train_bench.py --cp allgather-kv") and f"`{b['command']}`" in opening


def test_simulated_run_adds_predicted_comm(built):
    """--simulate-world 2 measures compute only: the report adds the communication predict.py places on it."""
    t1, ts = built["t"][1], built["t"]["sim"]
    (c,) = [c for c in built["json"]["configurations"] if c["strategy"] == "allgather-kv simulated"]
    base, row = c["rows"]
    assert base["run"] == t1["run_name"] and row["run"] == ts["run_name"] and row["W"] == 2 and row["simulated"]
    assert row["rank"] == 0 and f"| 2 sim, rank 0 | {ts['run_name']} |" in built["md"]  # the report row says so
    assert "1 other run(s) at W=2" in c["notes"][0]
    p = expected_prediction(ts, 2, links.from_dict(CPU_LINK))
    step = ts["metrics"]["step_ms"]["median"]
    assert row["step_ms"] == step and row["projected_step_ms"] == pytest.approx(p.predicted_ms)
    assert step < p.predicted_ms <= p.upper_ms
    assert row["speedup"]["projected_step"] == pytest.approx(t1["metrics"]["step_ms"]["median"] / p.predicted_ms)
    assert row["speedup"]["bounds"] == pytest.approx([t1["metrics"]["step_ms"]["median"] / x
                                                      for x in (p.upper_ms, p.lower_ms)])
    assert row["verdict"].startswith("W=2 (simulated, comm predicted with cpu-test)")


def test_reconciliation_section(built):
    """Prediction (simulated rank) vs measurement (real gloo processes), waterfall, figure, verdicts printed."""
    rec = built["json"]["reconcile"]
    assert rec["strategy"] == "allgather-kv" and "not the user's settings" in rec["note"]
    (r,) = rec["rows"]
    assert r["W"] == 2 and r["basis"].startswith("simulated") and r["measured_run"] == built["t"][2]["run_name"]
    assert r["error_pct"] == pytest.approx(100 * (r["predicted_ms"] / r["measured_ms"] - 1))
    assert sum(r["waterfall_ms"].values()) == pytest.approx(r["predicted_ms"])
    assert r["bounds"][0] <= r["predicted_speedup"] <= r["bounds"][1]
    assert r["isolated"]["sdpa_fwd"] == pytest.approx(ISO[1]["sdpa_fwd"] / ISO[2]["sdpa_fwd"])
    md = (built["out"] / "report.md").read_text()
    assert "## Reconciling the 1.66x" in md and "![reconcile](reconcile.png)" in md
    assert "The user's 1.66x is not compared" in md and "Isolated ops at W=2" in md
    # 5 timed calls per op (the test's ops runs): no verdict on the seed from them, whatever the ratio
    assert "is not conclusive: noisy (sdpa_fwd, sdpa_bwd: fewer than 10 timed calls" in md and "refutes" not in md
    assert "| None" not in md  # a missing figure reads "-" (the seed-compat rows' host time)
    assert (built["out"] / "reconcile.png").read_bytes()[:8] == PNG_MAGIC
    assert "reconcile: " in built["cli"].stdout and rec["answer"][0] in built["cli"].stdout
    assert _config(built["json"], 4)["rows"][1]["verdict"] in built["cli"].stdout  # the verdicts, not only the paths


def test_nan_runs_strict_json(train_runs, tmp_path):
    """A NaN loss makes a run partial; an all-NaN metric is said to be one; report.json is strict JSON."""
    t1, t2 = (json.loads(train_runs[w].read_text()) for w in (1, 2))
    nan = float("nan")
    t2["metrics"]["sdpa_fwd_ms"] = {"median": nan, "min": nan, "max": nan, "n": 3}
    t2["per_step"]["sdpa_fwd_ms"] = [nan] * 3
    bad = copy.deepcopy(t2) | {"run_name": "nan-loss"}
    bad["loss"][2] = nan
    for name, d in (("w1", t1), ("w2", t2), ("nanloss", bad)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(d))  # NaN written as the bare token
    r = report_cli(tmp_path, "--wandb-mode", "disabled")
    assert r.returncode == 0, r.stderr

    def reject(x):
        raise ValueError(f"non-strict JSON token {x}")

    rep = json.loads((tmp_path / "report" / "report.json").read_text(), parse_constant=reject)
    (s,) = rep["skipped"]
    assert s["status"] == "partial" and "NaN loss at step 2" in s["reason"]
    (c,) = rep["configurations"]
    row = c["rows"][1]
    assert "metric sdpa_fwd_ms: all NaN (not reported)" in row["notes"] and row["regions_ms"]["sdpa_fwd"] is None
    assert "min <= median <= max" not in (tmp_path / "report" / "report.md").read_text()
    assert "No ops runs" in (tmp_path / "report" / "report.md").read_text()
    assert not (tmp_path / "report" / "c1_ops.png").exists() or True  # in-step op times exist: drawn without iso


def test_bad_input(tmp_path):
    r = report_cli(tmp_path)  # empty folder
    assert r.returncode == 2 and "no summary.json found" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = report_cli(tmp_path / "nope")
    assert r.returncode == 2 and "not a directory" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = report_cli(tmp_path, "--link-gbps", "0")
    assert r.returncode == 2 and "--link-gbps" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = report_cli(tmp_path, "--wandb-mode", "sometimes")
    assert r.returncode == 2 and "--wandb-mode" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    write(tmp_path / "a" / "summary.json", "[1, 2")  # nothing usable: the report still lists it, exit 1
    r = report_cli(tmp_path, "--wandb-mode", "disabled")
    assert r.returncode == 1 and "no usable run" in r.stderr
    assert "unreadable JSON" in (tmp_path / "report" / "report.md").read_text()

