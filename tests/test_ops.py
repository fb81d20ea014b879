"""--ops-only: the op microbenchmark end to end (real gloo ranks), its simulation, its bad-input errors."""

import json
import math
import subprocess
import sys

import pytest
import torch

from flux_cp.checks import resolve
from flux_cp.config import parse_config
from flux_cp.opbench import OPS, OpBench
from flux_cp.runs.results import OPS_METRICS, validate

from .conftest import ROOT, TINY, bench, main_in_process


def _rows(d, **match):
    return [r for r in d["ops"] if all(r[k] == v for k, v in match.items())]


def test_devices_2_writes_a_valid_ops_summary(tmp_path):
    r = bench("--ops-only", "--devices", 2, "--config", TINY, "--seq-lens", "144,288", "--seed-compat",
              "--output", tmp_path, "--wandb-mode", "offline")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sdpa_fwd" in r.stdout and "seed-compat" in r.stdout  # the table, on stdout
    answer, nxt = r.stdout.strip().splitlines()[-2:]  # the end line the README promises, with its caveat
    assert answer.startswith("ops per call at S=144 (isolated: not the step") and "W=2 sdpa_fwd " in answer
    assert answer.endswith("(from 5 timed calls per op: noisy)") and nxt.startswith("next: python scripts/report.py")
    d = json.loads((tmp_path / "summary.json").read_text())
    assert validate(d) == [] and d["complete"]
    assert (d["mode"], d["world_size"], d["cp"], d["simulate_world"], d["loss"]) == ("ops", 2, "allgather-kv", None, [])
    assert d["peak_tflops"] is None and d["tokens_per_rank"] == 72  # no GEMM peak on CPU
    for name in OPS_METRICS:  # device and host time per call, first seq len, both ranks
        for key in (name, name[:-3] + "_host_ms"):
            m = d["metrics"][key]
            assert m["n"] == 5 and 0 < m["min"] <= m["median"] <= m["max"] < math.inf, key
        assert d["metrics"][name]["rank_min_median"] <= d["metrics"][name]["rank_max_median"]
    for s in (144, 288):
        for op in OPS:
            (row,) = _rows(d, op=op, seq_len=s, method="corrected")
            assert row["world"] == 2 and not row["simulated"] and not row["graph"] and row["tflops"] > 0
        (fwd,) = _rows(d, op="sdpa_fwd", seq_len=s, method="corrected")
        assert fwd["shape"] == f"q,k,v(1,4,{s // 2},16) local" and fwd["flops"] == 4 * 4 * (s // 2) * s * 16
        (gemm,) = _rows(d, op="qkv_gemm_fwd", seq_len=s, method="corrected")
        assert gemm["shape"] == f"({s // 2},64)x(64,192)"  # the real projection: K = hidden
        seed = {r["op"]: r for r in _rows(d, seq_len=s, method="seed-compat")}
        assert set(seed) == {"sdpa_fwd", "sdpa_bwd", "qkv_gemm_fwd"}
        assert seed["qkv_gemm_fwd"]["shape"] == f"(1,4,{s // 2},16)x(16,48)"  # the seed's: K = head_dim
        assert all(r["host_ms"] is None and r["device_ms"]["n"] == 1 for r in seed.values())
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0


def test_simulate_world_runs_the_real_strategy_on_a_fake_group(tmp_path):
    """--simulate-world 1,4: rank 0 of a 1-rank and of a 4-rank job over torch's fake process group, in one
    process: the real Ulysses strategy (its all-to-all layouts around SDPA over H/W heads) on local tokens."""
    r = bench("--ops-only", "--config", TINY, "--simulate-world", "1,4", "--cp", "ulysses",
              "--output", tmp_path, "--wandb-mode", "disabled")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((tmp_path / "summary.json").read_text())
    assert validate(d) == []
    assert (d["world_size"], d["simulate_worlds"], d["collectives"]) == (1, [1, 4], "fake")
    assert {(r["world"], r["simulated"]) for r in d["ops"]} == {(1, False), (4, True)}
    (fwd4,) = _rows(d, op="sdpa_fwd", world=4)
    assert fwd4["shape"] == "q,k,v(1,4,36,16) local"  # the rank's tokens in; heads split inside the strategy
    assert not (tmp_path / "wandb").exists()


BAD = [
    (["--devices", 2, "--seq-lens", 145], "--seq-lens 145: 97 image + 48 text tokens"),
    (["--simulate-world", 3, "--cp", "ulysses"], "--model.num_heads 4 is not divisible by W = 3"),
    (["--simulate-world", 2, "--devices", 2], "--simulate-world runs on one process"),
    (["--simulate-world", 2, "--cp", "torch"], "--cp torch: torch's context_parallel intercepts only CUDA"),
    (["--seq-lens", "4608,abc"], "--seq-lens 4608,abc: expected comma-separated integers"),
    (["--graph"], "--graph: CUDA graphs need a GPU"),
    (["--seq-lens", 10], "--seq-lens 10: shorter than the text tokens (data.text_tokens 48) plus one image token"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_ops_input_is_one_line_and_exit_2(tmp_path, args, message):
    rc, lines = main_in_process("--ops-only", "--config", TINY, *args, "--output", tmp_path / "run")
    assert rc == 2
    assert len(lines) == 1 and lines[0].startswith("train_bench.py: error: ") and message in lines[0], lines
    assert not (tmp_path / "run").exists()  # nothing ran


@pytest.mark.gpu
@pytest.mark.exclusive
def test_plain_sdpa_matches_a_plain_torch_script():
    """opbench's corrected timing of a plain SDPA call agrees with tools/plain_sdpa_timing.py."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    argv = ["--config", str(ROOT / "configs/flux_4608.yaml"), "--ops-only", "--cp", "none", "--seq-lens", "4608"]
    cfg = resolve(parse_config(argv, cuda_available=True), cuda_available=True, gpu_count=1)
    ob = OpBench(cfg, 0, 1, torch.device("cuda", 0), barrier=lambda: None)
    ob.run()
    plain = subprocess.run([sys.executable, str(ROOT / "tools/plain_sdpa_timing.py"), "--seq-len", "4608"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    ref = json.loads(plain.stdout.strip().splitlines()[-1])
    for op in ("sdpa_fwd", "sdpa_bwd"):
        (row,) = _rows({"ops": ob.rows}, op=op)
        got, want = row["device_ms"]["median"], ref[f"{op}_ms"]
        print(f"{op}: opbench {got:.4f} ms, plain script {want:.4f} ms")
        assert abs(got - want) <= 0.15 * want + 0.02, (op, got, want)
