"""The report on real CPU runs (W=1 none, W=2 allgather-kv) plus ops-mode summaries built to the
ops format: its numbers equal those computed from the summaries, figures and HTML are valid,
bad runs are listed rather than fatal, and bad input fails with one line."""

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
from flux_cp.report import OPS, build, tables
from flux_cp.report import write as write_report
from flux_cp.runs.results import validate

from .conftest import ROOT, bench

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


def write(path, d):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(d if isinstance(d, str) else json.dumps(d))


@pytest.fixture(scope="module")
def train_runs(tmp_path_factory):
    """Three real CPU runs, made once: W=1 (--cp none), W=2 (allgather-kv), and W=2 simulated in one process."""
    base = tmp_path_factory.mktemp("train")
    out = {}
    for name, args in ((1, ["--devices", 1, "--cp", "none"]), (2, ["--devices", 2, "--cp", "allgather-kv"]),
                       ("sim", ["--devices", 1, "--cp", "allgather-kv", "--simulate-world", 2])):
        r = bench(*args, "--wandb-mode", "disabled", "--group", "rpt", "--output", base / f"w{name}")
        assert r.returncode == 0, r.stderr[-3000:]
        out[name] = base / f"w{name}" / "summary.json"
    return out


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
