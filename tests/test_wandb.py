"""What a run records of itself and its host, and what wandb holds of it, read back from the offline run's own file
(tests/wandb_records.py): the summary as summary.json has it (the median under the metric's own name, min/max/n
beside it: wandb's run table ranks runs by it), warm-up steps out of the measured series, every row on a time axis,
keys to filter runs by; the host's speed before and after the steps."""

import json

import pytest

from .conftest import TINY, bench
from .wandb_records import history, run_info

WARMUP, STEPS = 2, 6


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("wandb")
    r = bench("--config", TINY, "--steps", STEPS, "--warmup-steps", WARMUP, "--regions-every", 2,
              "--wandb-mode", "offline", "--output", out)
    assert r.returncode == 0, r.stderr[-3000:]
    (f,) = out.glob("wandb/offline-run-*/run-*.wandb")
    return json.loads((out / "summary.json").read_text()), run_info(f), history(f)


def test_the_summary_is_summary_json_s(offline_run):
    d, info, _ = offline_run
    s = info["summary"]
    names = ["step_ms", "host_ms", "step_timed_ms", "sdpa_fwd_ms", "sdpa_bwd_ms", "qkv_gemm_fwd_ms", "qkv_gemm_bwd_ms"]
    for name in names:
        m = d["metrics"][name]
        assert s[name] == pytest.approx(m["median"]) and s[f"{name}/n"] == m["n"], name
        assert (s[f"{name}/min"], s[f"{name}/max"]) == pytest.approx((m["min"], m["max"])), name
    t = d["throughput"]
    for key in ("throughput/device/items_per_sec", "throughput/device/samples_per_sec", "throughput/items_per_sec"):
        assert s[key] == pytest.approx(t[key])
    assert t["throughput/device/items_per_sec"] == pytest.approx(144 / (d["metrics"]["step_ms"]["median"] / 1e3))
    # what the dashboards rank by: a real (here one-process) run's own measured figure, in summary.json and wandb
    assert d["ranked"]["basis"] == "measured"
    assert s["ranked/tokens_per_s_per_gpu"] == pytest.approx(d["ranked"]["tokens_per_s_per_gpu"])
    assert d["ranked"]["tokens_per_s_per_gpu"] == pytest.approx(t["throughput/device/items_per_sec"])


def test_warmup_steps_are_out_of_the_measured_series(offline_run):
    d, _, rows = offline_run
    warm = [r for r in rows if r["trainer/global_step"] < WARMUP]
    measured = [r for r in rows if r["trainer/global_step"] >= WARMUP]
    assert len(warm) == WARMUP and len(measured) == STEPS
    assert all("step_ms" not in r and "warmup/step_ms" in r for r in warm)
    assert sorted(r["step_ms"] for r in measured if "step_ms" in r) == sorted(d["per_step"]["step_ms"])
    assert all("loss" in r for r in rows)  # the loss curve keeps every step


def test_the_warmup_keys_summary_is_their_median_over_the_warmup_steps(offline_run):
    """wandb keeps a key's last value as its summary: the warm-up keys' is their median over the warm-up steps (the
    first step, compiling and allocating, is no more the summary than the last is), min, max and n beside it."""
    import statistics

    _, info, rows = offline_run
    s = info["summary"]
    keys = {k for r in rows for k in r if k.startswith("warmup/")}
    assert "warmup/step_ms" in keys
    for k in keys:
        vals = [r[k] for r in rows if k in r]  # a figure of the loop around the step (data_ms) starts a step late
        assert 1 <= len(vals) <= WARMUP, k
        assert s[k] == pytest.approx(statistics.median(vals)), k
        assert (s[f"{k}/min"], s[f"{k}/max"], s[f"{k}/n"]) == pytest.approx((min(vals), max(vals), len(vals))), k
    step = [r["warmup/step_ms"] for r in rows if "warmup/step_ms" in r]
    assert len(step) == WARMUP
    assert s["warmup/step_ms"] != step[-1] or len(set(step)) == 1  # not the last warm-up step's


def test_rows_carry_their_steps_own_time(offline_run):
    _, _, rows = offline_run
    t = [r["elapsed_s"] for r in rows]
    assert all(b > a for a, b in zip(t, t[1:]))
    plain = [r for r in rows if "step_ms" in r]
    assert all(r["throughput/device/items_per_sec"] == pytest.approx(144e3 / r["step_ms"]) for r in plain)


def test_runs_are_named_uniquely_and_filter_by_their_configuration(offline_run):
    d, info, _ = offline_run
    assert info["name"].startswith(d["run_name"] + "-") and info["name"] != d["run_name"]
    c = info["config"]
    assert (c["W"], c["cp"], c["dp"], c["weights"], c["batch"], c["S"]) == (1, "none", 1, "ddp", 1, 144)
    assert c["compile"] is False and c["step_graph"] is False and c["harness"] == "lightning"


def test_lora_runs_are_tagged_with_their_rank_and_trainable_parameters(offline_run, tmp_path):
    """A full fine-tune and a LoRA run filter apart: tags and the config's lora_rank and trainable_params."""
    full, info, _ = offline_run
    assert info["tags"] == ["full-finetune"] and info["config"]["lora_rank"] == 0
    assert info["config"]["trainable_params"] == full["params"] == full["optimizer_params"]
    out = tmp_path / "lora"
    r = bench("--config", TINY, "--steps", 2, "--warmup-steps", 1, "--wandb-mode", "offline", "--output", out,
              "--lora-rank", 4)
    assert r.returncode == 0, r.stderr[-3000:]
    (f,) = out.glob("wandb/offline-run-*/run-*.wandb")
    lora, d = run_info(f), json.loads((out / "summary.json").read_text())
    assert lora["tags"] == ["lora-r4"] and lora["config"]["lora_rank"] == 4
    assert lora["config"]["trainable_params"] == d["lora"]["trainable_params"] == d["optimizer_params"] == 8192


def test_the_dashboards_panels_name_only_what_the_runs_logged(offline_run, tmp_path):
    """The wandb Report's panels (built offline: nothing is saved) plot keys that the runs' wandb files hold: every
    line plot's x and y in the history rows, every bar plot's metric in the run summary."""
    import shutil

    import wandb_workspaces.reports.v2 as wr

    from flux_cp.report.runs import discover
    from flux_cp.report.wandb_out import dashboard_panels

    d, info, rows = offline_run
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text(json.dumps(d))
    runs, _ = discover(tmp_path)
    panels = dashboard_panels(wr, runs)
    logged = {k for r in rows for k in r}
    assert {type(p).__name__ for p in panels} == {"LinePlot", "BarPlot"}
    for p in panels:
        if isinstance(p, wr.LinePlot):
            assert p.x in logged and set(p.y) <= logged, (p.title, p.y)
        else:
            assert set(p.metrics) <= set(info["summary"]), (p.title, p.metrics)
    assert any("ranked/tokens_per_s_per_gpu" in getattr(p, "metrics", []) for p in panels)
    shutil.rmtree(tmp_path / "run")


def test_the_summary_carries_the_hosts_speed_before_and_after(offline_run, tmp_path):
    """A host-bound step is as fast as its host: each run probes the host (us per tiny op, median and spread) before
    its steps and after them, in both harnesses, and says whether the speed moved in between."""
    from .conftest import bench

    d = offline_run[0]
    r = bench("--config", TINY, "--steps", 3, "--warmup-steps", 1, "--harness", "bare", "--wandb-mode", "disabled",
              "--output", tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    for s in (d, json.loads((tmp_path / "summary.json").read_text())):
        h = s["host_speed"]
        for probe in (h["before"], h["after"]):
            assert 0 < probe["min_us"] <= probe["median_us"] <= probe["max_us"] and probe["reps"] == 7
        assert h["before"] == s["env"]["host_probe"] and isinstance(h["changed"], bool)
        assert s["host_op_us_end"] == h["after"]["median_us"]


def test_a_profiled_runs_summary_says_where_its_step_goes(tmp_path):
    """--profile: the kernel breakdown's parts reach wandb's summary as summary.json holds them (efficiency/...):
    the GEMMs' and attention's time (and, on a GPU, their share of the peak), the rest and the idle time."""
    r = bench("--config", TINY, "--steps", 4, "--warmup-steps", 1, "--profile", "true", "--profile-steps", 2,
              "--wandb-mode", "offline", "--output", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((tmp_path / "summary.json").read_text())
    (f,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    s, eff = run_info(f)["summary"], d["throughput"]["efficiency"]
    assert eff["gemm"]["ms"] > 0 and eff["attention"]["ms"] > 0  # CPU: aten GEMMs and SDPA ops stand in for kernels
    assert s["efficiency/gemm_ms"] == pytest.approx(eff["gemm"]["ms"])
    assert s["efficiency/attention_ms"] == pytest.approx(eff["attention"]["ms"])
    assert s["efficiency/rest_ms"] == pytest.approx(eff["rest_ms"])
