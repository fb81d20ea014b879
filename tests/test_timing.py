"""The timing callback end to end on CPU: two real ranks, every metric, the regions' arithmetic, the
profiler breakdown beside the events, the wandb offline run read back, and a failing wandb."""

import json
import math
import time

import pytest
import torch

from flux_cp.measure.profiling import breakdown, load_trace
from flux_cp.runs.results import TRAIN_METRICS, validate

from .conftest import TINY, bench
from .wandb_records import run_info

OPS = ("sdpa_fwd", "sdpa_bwd", "qkv_gemm_fwd", "qkv_gemm_bwd")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """W=2 allgather-kv, wandb offline, op regions in every other step, 2 profiled steps."""
    out = tmp_path_factory.mktemp("w2")
    r = bench("--config", TINY, "--devices", 2, "--steps", 6, "--warmup-steps", 1, "--regions-every", 2,
              "--profile", "true", "--profile-steps", 2, "--group", "sweep-t", "--output", out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads((out / "summary.json").read_text())


def test_every_metric_positive_finite_and_valid(two_ranks):
    _, d = two_ranks
    assert validate(d) == [] and d["complete"] and d["world_size"] == 2
    assert len(d["loss"]) == 1 + 2 + 6  # warm-up, profiled and measured steps all keep their loss
    for name in (*TRAIN_METRICS, *(f"{op}_call_ms" for op in OPS), "step_timed_ms"):
        m = d["metrics"][name]
        assert m["n"] == 3, name  # 6 measured steps, --regions-every 2: 3 with regions (step_timed_ms), 3 without
        assert all(math.isfinite(m[k]) and m[k] > 0 for k in ("median", "min", "max")), name
        assert 0 < m["rank_min_median"] <= m["rank_max_median"], name
    assert math.isfinite(d["timing_overhead_pct"])


def test_regions_are_parts_of_the_step(two_ranks):
    _, d = two_ranks
    steps = d["per_step"]["step_timed_ms"]  # the steps that carried the regions
    for i, step in enumerate(steps):  # per step, on rank 0
        ops = sum(d["per_step"][f"{op}_ms"][i] for op in OPS)
        assert 0 < ops < step
    # summed over blocks = per call x calls (2 double + 2 single blocks in tiny)
    blocks = d["config"]["model"]["double_blocks"] + d["config"]["model"]["single_blocks"]
    for op in OPS:
        total, per_call = d["per_step"][f"{op}_ms"], d["per_step"][f"{op}_call_ms"]
        assert all(math.isclose(t, c * blocks, rel_tol=1e-9) for t, c in zip(total, per_call))


def test_profile_breakdown_and_traces(two_ranks):
    out, d = two_ranks
    p = d["profile"]
    assert p["device"] == "cpu" and p["steps"] == 2
    for rank_file in p["trace_files"]:
        assert json.loads((out / rank_file).read_text())["traceEvents"]
    b = p["breakdown_ms"]
    assert b["attention"] > 0 and b["gemm"] > 0 and b["comm_attention"] > 0  # all-gathers of K/V on gloo
    parts = b["attention"] + b["gemm"] + b["comm_attention"] + b["comm_grad"] + b["other"]
    assert math.isclose(parts, b["step"], rel_tol=1e-6) and b["idle"] == 0
    for op in OPS:  # the same regions seen by events and by the profiler's ops inside them
        f = p["fidelity"][op]
        assert f["kernels_ms"] > 0 and f["events_ms"] >= f["kernels_ms"] * 0.9


def test_wandb_offline_run_holds_the_same_medians(two_ranks):
    out, d = two_ranks
    runs = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    info = run_info(runs[0])
    assert d["run_name"] == "train-W2-allgather-kv-s144" and info["name"].startswith(d["run_name"] + "-")
    assert info["group"] == "sweep-t" and info["job_type"] == "train"
    assert info["config"]["run"]["devices"] == 2 and info["config"]["env"]["torch"] == torch.__version__
    for name, m in d["metrics"].items():
        assert info["summary"][name] == pytest.approx(m["median"], rel=1e-12), name
        assert info["summary"][f"rank_max/{name}"] == pytest.approx(m["rank_max_median"], rel=1e-12), name
    assert info["summary"]["timing_overhead_pct"] == pytest.approx(d["timing_overhead_pct"])


def test_wandb_online_that_cannot_start_goes_offline(tmp_path):
    """Online with an API key and no wandb server: start-up is bounded (WANDB_INIT_TIMEOUT), one line says so, the
    run completes and its wandb run is kept offline."""
    env = {"WANDB_API_KEY": "a" * 40, "HOME": str(tmp_path), "WANDB_DIR": str(tmp_path),
           "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_INIT_TIMEOUT": "5"}
    t0 = time.monotonic()
    r = bench("--config", TINY, "--steps", 2, "--wandb-mode", "online", "--output", tmp_path / "run", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert time.monotonic() - t0 < 90  # wandb's own default waits ~2 minutes
    said = [ln for ln in r.stderr.splitlines() if "wandb" in ln.split(str(tmp_path))[0]]
    assert len(said) == 1 and said[0].startswith("train_bench.py: wandb online did not start ("), r.stderr[-3000:]
    d = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert d["complete"] and validate(d) == [] and sum(d["step_kinds"].values()) == 2
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert not list((tmp_path / "run" / "wandb").glob("run-*"))  # no empty online run left beside it


def test_kernel_breakdown_of_a_cuda_trace():
    """The CUDA path of the parser on a small trace: launches matched by correlation, overlap counted once."""

    def launch(ts, corr):
        return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "args": {"correlation": corr}}

    def kernel(name, ts, dur, corr):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}

    ev = [
        {"cat": "user_annotation", "name": "flux_cp::step5", "ts": 0, "dur": 100},
        {"cat": "user_annotation", "name": "flux_cp::qkv_gemm_fwd", "ts": 10, "dur": 5},
        {"cat": "user_annotation", "name": "flux_cp::sdpa_fwd", "ts": 20, "dur": 5},
        launch(11, 1), kernel("sm90_xmma_gemm_bf16", 100, 400, 1),
        launch(21, 2), kernel("flash_fwd_kernel", 500, 300, 2),
        launch(30, 3), kernel("ncclDevKernel_AllReduce_Sum_bf16", 700, 200, 3),  # overlaps the flash kernel
        launch(40, 4), kernel("vectorized_elementwise_kernel", 1000, 100, 4),  # 100 us gap before it
        launch(200, 5), kernel("flash_fwd_kernel", 2000, 10, 5),  # launched after the step: not counted
    ]
    b = breakdown(ev)
    assert b["device"] == "cuda" and b["steps"] == 1
    assert b["breakdown_ms"] == pytest.approx(
        {"attention": 0.3, "gemm": 0.4, "comm_attention": 0.0, "comm_grad": 0.2, "optimizer": 0.0, "other": 0.1,
         "busy": 0.9, "idle": 0.1, "step": 1.0}
    )
    assert b["ops_call_ms"] == pytest.approx({"qkv_gemm_fwd": 0.4, "sdpa_fwd": 0.3})
    top = b["top_kernels_ms"]  # what each class is made of, by name; the kernel launched after the step not in it
    assert top["attention"] == [["flash_fwd_kernel", pytest.approx(0.3)]]
    assert top["other"] == [["vectorized_elementwise_kernel", pytest.approx(0.1)]]


def test_kernel_breakdown_of_the_committed_h200_trace():
    """The parser on a real trace (H200, Flux config, W=1, docs/archive): the same figures as its summary."""
    from pathlib import Path

    d = Path(__file__).resolve().parents[1] / "docs" / "archive" / "2026-12-02-h200-timing"
    b = breakdown(load_trace(d / "runs" / "w1-none-ab-profile" / "trace_rank0.json.gz"))
    recorded = json.loads((d / "runs" / "w1-none-ab-profile" / "summary.json").read_text())["profile"]
    assert b["device"] == "cuda" and b["steps"] == recorded["steps"] == 3
    for k in ("attention", "gemm", "busy", "idle", "step"):
        assert b["breakdown_ms"][k] == pytest.approx(recorded["breakdown_ms"][k])
    assert b["breakdown_ms"]["optimizer"] > 1.0  # fused AdamW over ~1.2 B parameters
    assert b["ops_call_ms"] == pytest.approx(recorded["ops_call_ms"])
    assert sum(b["breakdown_ms"][k] for k in ("attention", "gemm", "optimizer", "other")) == pytest.approx(
        b["breakdown_ms"]["busy"], rel=0.05)  # one stream at W=1: kernels barely overlap


def test_a_step_read_after_the_next_one_started_keeps_its_own_figures():
    """The callback reads step k while step k+1 runs (no per-step synchronize): each closed step keeps its
    boundaries and regions, whatever the timer has done since."""
    import time

    from flux_cp.measure.timing import StepTimer

    t = StepTimer(cuda=False)
    t.start_step(regions=True)
    call = t.open("sdpa")
    (x,) = call.enter(torch.ones(4, requires_grad=True))
    (y,) = call.exit(x * 2)
    y.sum().backward()
    first = t.end_step()
    t.start_step(regions=False)  # the next step: no regions, and slower
    assert t.open("sdpa").enter(y) == (y,)
    time.sleep(0.05)
    second = t.end_step()
    a, b = t.read(first), t.read(second)
    assert {"sdpa_fwd_ms", "sdpa_bwd_ms", "sdpa_fwd_call_ms"} <= a.keys() and "sdpa_fwd_ms" not in b
    assert b["step_ms"] >= 50 > a["step_ms"] > a["sdpa_fwd_ms"] > 0


def test_a_long_run_reads_finished_steps_in_the_loop(tmp_path):
    """Past max_pending unread steps (a long run) the loop reads finished steps, a step old, never waiting; the
    figures are those of a run read after the loop. In process: the real module, callback and Trainer on CPU."""
    import lightning as L

    from callbacks.timing import OpTimingCallback
    from flux_cp.checks import resolve
    from flux_cp.config import parse_config
    from flux_cp.model import num_params
    from flux_cp.runs.header import train_header
    from flux_cp.train.module import FluxCPModule

    cfg = parse_config(["--config", str(TINY), "--steps", "6", "--warmup-steps", "1", "--wandb-mode", "disabled",
                        "--output", str(tmp_path)])
    cfg = resolve(cfg, cuda_available=False, gpu_count=0)
    module = FluxCPModule(cfg)
    timing = OpTimingCallback(tmp_path / "summary.json", train_header(cfg, num_params(module.model)), 1,
                              max_pending=2)
    L.Trainer(accelerator="cpu", devices=1, max_steps=7, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, callbacks=[timing]).fit(module)
    d = json.loads((tmp_path / "summary.json").read_text())
    assert d["complete"] and len(d["loss"]) == 7 and sum(d["step_kinds"].values()) == 6
    assert d["reads"]["in_loop"] >= 3 and d["reads"]["waited_in_loop"] == 0 and d["reads"]["lag_steps_median"] >= 1
    assert d["reads"]["in_loop"] + d["reads"]["after_loop"] == 6
