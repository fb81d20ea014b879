"""The entry point as a user meets it: summary.json, wandb offline files, bad-input errors."""

import json

import pytest

from flux_cp.results import TRAIN_METRICS, validate

from .conftest import TINY, bench


def test_devices_2_on_cpu_writes_a_valid_summary(tmp_path):
    r = bench("--devices", 2, "--output", tmp_path, "--wandb-mode", "offline")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no GPU found: a tiny CPU config" in r.stderr
    d = json.loads((tmp_path / "summary.json").read_text())
    assert validate(d) == []
    assert d["sdpa_backend"] == "auto"
    assert d["mode"] == "train" and d["world_size"] == 2 and d["cp"] == "allgather-kv" and d["complete"]
    steps = d["config"]["run"]["steps"]
    assert len(d["loss"]) == steps + d["config"]["run"]["warmup_steps"]
    for name in TRAIN_METRICS:
        m = d["metrics"][name]
        assert m["n"] == steps and 0 < m["min"] <= m["median"] <= m["max"]
        assert m["rank_min_median"] <= m["rank_max_median"]
    # the op regions are parts of the step
    ops = sum(d["metrics"][k]["median"] for k in TRAIN_METRICS[2:])
    assert ops < d["metrics"]["step_ms"]["median"]
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0


def test_timing_off_keeps_step_metrics_only(tmp_path):
    r = bench("--config", TINY, "--timing", "false", "--wandb-mode", "disabled", "--output", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((tmp_path / "summary.json").read_text())
    assert set(d["metrics"]) == {"step_ms", "host_ms", "loop_ms", "host_wait_ms", "data_ms", "transfer_ms",
                                 "prologue_ms", "after_ms", "gc_ms"}
    assert d["metrics"]["data_ms"]["median"] > 0  # the next batch is made between steps (no workers on CPU)
    # the loop's period holds the step and the batch made between steps (on CPU ops run in line)
    assert d["metrics"]["loop_ms"]["median"] > d["metrics"]["step_ms"]["median"]
    # the host's period, accounted whole: a step's host_ms + after_ms, then the next's data, transfer, prologue
    ps = d["per_step"]
    for i in range(len(ps["loop_ms"]) - 1):
        nxt = sum(ps[k][i + 1] for k in ("data_ms", "transfer_ms", "prologue_ms"))
        parts = ps["host_ms"][i] + ps["after_ms"][i] + nxt
        assert abs(parts - ps["loop_ms"][i]) < 0.05 * ps["loop_ms"][i] + 0.2, (i, parts, ps["loop_ms"][i])
    assert d["metrics"]["loop_ms"]["n"] == d["metrics"]["step_ms"]["n"] - 1  # the last step has no next one


def test_gc_every_collects_on_schedule_only(tmp_path):
    """--gc-every 3: no automatic collection in training; one after every 3rd step, in that step's loop period."""
    r = bench("--config", TINY, "--gc-every", 3, "--steps", 8, "--warmup-steps", 1, "--wandb-mode", "disabled",
              "--output", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((tmp_path / "summary.json").read_text())
    gc_ms = d["per_step"]["gc_ms"]  # measured steps 1..7 (batch_idx), the last one has no loop period
    collected = [(i + 1) % 3 == 0 for i in range(1, 1 + len(gc_ms))]
    assert len(gc_ms) == 7 and all((ms > 0) == c for ms, c in zip(gc_ms, collected)), gc_ms


BAD = [
    (["--devices", 5], "not divisible by the CP degree 5"),
    (["--devices", 3, "--cp", "ulysses"], "--model.num_heads 4 is not divisible by the CP degree 3"),
    (["--accelerator", "gpu"], "--accelerator gpu: no CUDA device"),
    (["--cp", "torch"], "--cp torch:"),
    (["--config", "configs/nope.yaml"], "--config configs/nope.yaml: file not found"),
    (["--model.num_hedz", 3], "num_hedz"),
    (["--cp", "ring"], "--cp:"),
    (["--steps", "many"], "--steps:"),
    (["--simulate-world", 2, "--devices", 2], "--simulate-world 2: this one process is a rank of the simulated job"),
    (["--simulate-world", 1], "--simulate-world 1: a simulated job has W >= 2 ranks"),
    (["--simulate-world", 4, "--simulate-rank", 4], "--simulate-rank 4: ranks of --simulate-world 4 run 0..3"),
    (["--simulate-rank", 1], "--simulate-rank 1: needs --simulate-world W"),
    (["--simulate-world", 8, "--cp", "ulysses"], "--model.num_heads 4 is not divisible by the CP degree 8"),
    (["--simulate-world", 5], "not divisible by the CP degree 5"),
    (["--compile", "true", "--warmup-steps", 1], "--warmup-steps 1: --compile"),
    (["--profile", "true", "--profile-steps", 0], "--profile-steps 0"),
    (["--sync-debug"], "--sync-debug: torch's sync debug mode watches CUDA calls"),
    (["--devices", 3, "--split-conditioning", "true"], "--split-conditioning: the modulation linears' widths"),
    (["--gc-every", -1], "--gc-every -1: 0 (Python's automatic collection)"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    r = bench(*args, "--output", tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not (tmp_path / "summary.json").exists()  # nothing ran


def test_unknown_key_in_config_file(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(TINY.read_text() + "stepz: 3\n")
    r = bench("--config", cfg)
    assert r.returncode == 2 and "stepz" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unreadable_config_file(tmp_path):
    cfg = tmp_path / "locked.yaml"
    cfg.write_text("steps: [\n")
    r = bench("--config", cfg)
    assert r.returncode == 2 and f"--config {cfg}" in r.stderr
