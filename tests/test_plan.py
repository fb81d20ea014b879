"""The planner (scripts/plan.py, flux_cp/plan/): every plan of a cell that divides, the ones that do not fit left out
with their reason, each run as a simulated rank and ranked by the time a global batch takes; and the global batch it
rests on trains as one process."""

import json
import subprocess
import sys

import pytest

from flux_cp.config import parse_config
from flux_cp.plan.plans import enumerate_plans
from flux_cp.plan.rank import command

from .conftest import ROOT, TINY, assert_exact, exact_run


def _cfg():
    return parse_config(["--config", str(TINY)], cuda_available=False)


def test_every_plan_that_divides_and_why_the_others_do_not():
    plans = enumerate_plans(_cfg(), seq_len=144, global_batch=2, world=4, on_gpu=False)
    kept = {p.name for p in plans if p.pruned is None}
    # dp x cp of 4 with B = 2: dp 4 cannot split 2 samples; cp 4 and cp 2 (dp 2) can; torch's ring needs a GPU
    assert kept == {f"dp{dp}x{cp}{c}-{w}-eager" for dp, c in ((1, 4), (2, 2)) for cp in ("allgather-kv", "ulysses")
                    for w in ("ddp", "zero2", "zero2f", "fsdp")} | {"dp1xtp4-ddp-eager", "dp2xtp2-ddp-eager"}
    why = {p.name: p.pruned for p in plans if p.pruned}
    assert all("--data.global_batch 2" in why[f"dp4-{w}-eager"] for w in ("ddp", "zero2", "zero2f", "fsdp"))
    assert "--weights zero2 does not combine" in why["dp1xtp4-zero2-eager"]
    assert "--weights zero2 does not combine" in why["dp1xtp4-zero2f-eager"]
    # zero2f: ZeRO-2 with its gathers under the next forward
    (f,) = [p for p in plans if p.name == "dp2xulysses2-zero2f-eager"]
    assert "--weights zero2 --zero2-gather forward" in command(f, "configs/tiny.yaml")
    assert not any(p.cp == "torch" for p in plans)  # CPU: no ring kernel to run


def test_plans_that_do_not_fit_the_memory_are_left_out():
    """The tiny model is fp32: 6 B parameters weigh what Flux.1's 11.9 B do in bf16. DDP keeps five copies whole,
    ZeRO-2 its parameters and gradient buckets whole (on an 80 GiB H100 Flux.1's ZeRO-2 ran out of memory), FSDP
    a 1/W share; the limit leaves 5% of the device to the CUDA context and the allocator."""
    def plans(params):
        return {p.weights: p for p in enumerate_plans(_cfg(), seq_len=144, global_batch=8, world=8, on_gpu=False,
                                                      memory_gib_limit=80, params=params, cps=("none",))}
    by = plans(6_000_000_000)
    assert by["ddp"].pruned.startswith("does not fit: ~") and by["ddp"].memory_gib > 80
    assert by["zero2"].pruned is None and by["fsdp"].pruned is None
    assert by["fsdp"].memory_gib < by["zero2"].memory_gib < 0.95 * 80
    by = plans(12_000_000_000)
    assert by["zero2"].pruned.startswith("does not fit: ~") and by["zero2"].pruned.endswith("(95% of the device's)")
    assert by["fsdp"].pruned is None


def test_the_command_runs_the_plan_on_real_gpus():
    (p,) = [p for p in enumerate_plans(_cfg(), 144, 4, 4, on_gpu=False, cps=("ulysses",), weights=("zero2",))
            if p.cp_degree == 2]
    cmd = command(p, "configs/tiny.yaml")
    assert cmd.startswith("python scripts/train_bench.py --config configs/tiny.yaml --devices 4")
    assert "--data.global_batch 4 --cp ulysses --cp-degree 2 --weights zero2" in cmd
    assert "simulate" not in cmd


def test_plan_ranks_the_plans_it_ran_by_time_per_global_batch(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "plan.py"), "--config", str(TINY), "--global-batch",
                        "2", "--world", "2", "--cp", "none,allgather-kv", "--weights", "ddp", "--steps", "4",
                        "--warmup-steps", "1", "--output", str(tmp_path)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((tmp_path / "plan.json").read_text())
    ran = [row for row in d["plans"] if row["status"] == "ran"]
    assert {row["plan"] for row in ran} == {"dp2-ddp-eager", "dp1xallgather-kv2-ddp-eager"}
    assert [row["rank"] for row in ran] == [1, 2] and ran[0]["step_ms"] <= ran[1]["step_ms"]
    for row in ran:
        assert row["tokens_per_s_per_gpu"] == pytest.approx(2 * 144 / (row["step_ms"] / 1e3) / 2)
        assert "mfu" in row and row["mfu"] is None  # fp32 on a CPU: no dense bf16 peak to hold it against
        assert row["basis"] == "simulated rank, collectives priced" and row["peak_gib"] > 0
    assert [row["baseline"] for row in d["plans"] if row["plan"] == "dp2-ddp-eager"] == [True]
    assert d["summary"]["data_parallel"]["plan"] == "dp2-ddp-eager"
    assert f"best: {ran[0]['plan']}" in r.stdout and "run it: python scripts/train_bench.py" in r.stdout
    # the report over the same folder carries the cell: report.json `plans`, ranked rows with tokens/s and MFU
    from flux_cp.report import build, write

    rep = json.loads(write(build(tmp_path), tmp_path / "report")["json"].read_text())
    (cell,) = rep["plans"]
    assert cell["cell"] == "S144-B2-W2" and [p["plan"] for p in cell["plans"][:2]] == [row["plan"] for row in ran]
    assert all("tokens_per_s_per_gpu" in p and "mfu" in p for p in cell["plans"][:2])


@pytest.mark.parametrize("args", [["--global-batch", "0", "--world", "2"],
                                  ["--global-batch", "2", "--world", "2", "--cp", "ring"],
                                  ["--cells", "144:2:2 144:2"], ["--cells", "144:2:2", "--world", "2"],
                                  ["--cells", "144:2:2 144:1:2", "--only", "dp2-ddp-eager,dp3-ddp-eager"]])
def test_bad_input_is_one_line(args, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "plan.py"), *args, "--output", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("plan.py: error:")
    assert not (tmp_path / "o").exists()


def test_cells_run_in_one_process_each_into_its_folder_then_the_map(tmp_path):
    # --only over cells: each cell runs the named plans it has
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "plan.py"), "--cells", "144:1:1 144:2:2", "--cp",
                        "none", "--weights", "ddp", "--only", "dp1-ddp-eager,dp2-ddp-eager", "--steps", "2",
                        "--warmup-steps", "1", "--output", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    for cell, plan in (("S144-B1-W1", "dp1-ddp-eager"), ("S144-B2-W2", "dp2-ddp-eager")):
        d = json.loads((tmp_path / cell / "plan.json").read_text())
        assert d["cell"] == cell and d["summary"]["best"]["plan"] == plan
    assert [row["cell"] for row in json.loads((tmp_path / "map.json").read_text())] == ["S144-B1-W1", "S144-B2-W2"]


def test_a_global_batch_over_data_parallel_groups_trains_as_one_process(single_process, tmp_path):
    """--data.global_batch 2 over 2 ranks of plain data parallelism: each trains 1 sample, and the 10 steps are
    the one-process model's at batch 2 (fp64)."""
    got = exact_run(tmp_path, "--devices", 2, "--cp-degree", 1, "--data.global_batch", 2)
    assert got["summary"]["config"]["data"]["batch_size"] == 1 and got["summary"]["dp"] == 2
    assert got["summary"]["throughput"]["samples_per_step"] == 2
    assert_exact(got, single_process(2), rtol=1e-12)


def test_the_decision_map_gives_each_cell_its_best_plan_and_plain_dp_beside_it(tmp_path):
    """plan.py --map over the H100 cells (docs/archive): one row a cell, the best plan, the runner-up and plain DP."""
    from flux_cp.plan.decision_map import load_map, render_markdown

    src = ROOT / "docs" / "archive" / "2026-12-05-h100-plan-map"
    rows = load_map(src)
    assert [r["cell"] for r in rows] == ["S4608-B1-W1", "S4608-B1-W8", "S4608-B8-W8", "S65536-B1-W1",
                                         "S65536-B1-W8"]
    by = {r["cell"]: r for r in rows}
    assert by["S4608-B8-W8"]["best"]["plan"] == by["S4608-B8-W8"]["data_parallel"]["plan"] == "dp8-zero2-eager"
    assert by["S4608-B1-W8"]["data_parallel"] is None  # one sample does not split over 8 data-parallel ranks
    assert by["S65536-B1-W8"]["best"]["plan"] == "dp1xulysses8-zero2-eager"
    table = render_markdown(rows)
    assert "| 4608 | 8 | 8 | **dp8-zero2-eager: 74,758, 39%** |" in table
    for f in src.glob("*.plan.json"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "plan.py"), "--map", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "map.png").stat().st_size > 10_000 and json.loads((tmp_path / "map.json").read_text())
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "plan.py"), "--map", str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no <cell>/plan.json" in r.stderr
