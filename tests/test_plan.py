"""The planner (scripts/plan.py, flux_cp/plan/): every plan of a cell that divides, the ones that do not fit left out
with their reason, each run as a simulated rank and ranked by the time a global batch takes; and the global batch it
rests on trains as one process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flux_cp.config import parse_config
from flux_cp.plan.plans import count_params, enumerate_plans
from flux_cp.plan.rank import command, confidence, mark_ties, overlap

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
    assert all("--data.global_batch 2" in why[f"dp4-{w}-eager"] for w in ("ddp", "zero2", "zero2f", "fsdp", "fsdpoff"))
    # where fsdp fits, its offloading twin is left out
    assert why["dp2xulysses2-fsdpoff-eager"].startswith("fsdp fits: offloading")
    assert "--weights zero2 does not combine" in why["dp1xtp4-zero2-eager"]
    assert "--weights zero2 does not combine" in why["dp1xtp4-zero2f-eager"]
    # zero2f: ZeRO-2 with its gathers under the next forward
    (f,) = [p for p in plans if p.name == "dp2xulysses2-zero2f-eager"]
    assert "--weights zero2 --zero2-gather forward" in command(f, "configs/tiny.yaml")
    ring = [p for p in plans if p.cp == "torch"]  # CPU: no ring kernel to run, left out with the reason
    assert {p.name for p in ring} == {f"dp{dp}xtorch{c}-{w}-eager" for dp, c in ((1, 4), (2, 2))
                                      for w in ("ddp", "zero2", "zero2f", "fsdp", "fsdpoff")}
    assert all(p.pruned.startswith("--cp torch: torch's context_parallel") and "CUDA" in p.pruned for p in ring)


def test_plans_that_do_not_fit_the_memory_are_left_out():
    """The tiny model is fp32: 6 B parameters weigh what Flux.1's 11.9 B do in bf16. DDP keeps four copies whole
    (parameters, buckets, two moments) and makes a fifth, the gradients, in the backward; ZeRO-2 its parameters and
    gradient buckets whole (on an 80 GiB H100 Flux.1's ZeRO-2 ran out of memory), FSDP a 1/W share; the limit leaves
    5% of the device to the CUDA context and the allocator."""
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


def test_checkpointing_is_a_plan_axis_that_the_memory_estimate_prunes_by():
    """--checkpointing none,selective,full: each plan in each mode (named -ac<mode>, its run setting), estimated by
    what the mode keeps (Flux.1's measured peaks [P]: selective about half of none's activations, full each block's
    input and one block's whole): at Flux.1's depth and 4608 tokens, four samples a rank under FSDP over 8 fit 80 GiB
    with selective or full and not without (measured: out of memory; 72.8 GiB selective, 17.8 full)."""
    cfg = parse_config(["--config", str(ROOT / "configs" / "flux1.yaml")], cuda_available=True)
    plans = {p.checkpointing: p for p in enumerate_plans(cfg, seq_len=4608, global_batch=32, world=8, cps=("none",),
                                                         weights=("fsdp",), memory_gib_limit=80,
                                                         checkpointing=("none", "selective", "full"))}
    assert {m: p.name for m, p in plans.items()} == {
        "none": "dp8-fsdp-eager-acc2", "selective": "dp8-fsdp-eager-acselective", "full": "dp8-fsdp-eager-acfull"}
    assert plans["none"].accumulate == 2  # four at once do not fit: two micro-batches of two
    assert plans["selective"].settings["checkpointing"] == "selective" and "checkpointing" not in plans["none"].settings
    assert plans["full"].memory_gib < 25 < plans["selective"].memory_gib < 0.95 * 80
    assert "--checkpointing full" in command(plans["full"], "configs/flux1.yaml")


def test_lora_keeps_the_frozen_base_alone_so_flux1_fits_one_gpu():
    """Flux.1 at 4608 tokens, one sample: full fine-tuning's weights and AdamW moments (3 x 2 bytes x 11.9 B) and the
    larger of its activations and its gradients (one rank alone trains without DDP's buckets: the gradients fill as
    the backward frees the activations) cannot fit 80 GiB on one GPU; with LoRA (rank 64 on attention) the base is
    kept once, without gradients or moments, and the adapters' share is small: the W=1 plan fits, and under FSDP
    over 8 the base is sharded too."""
    from flux_cp.lora import adapter_params

    def plans(*lora, world=1, weights=("ddp",)):
        cfg = parse_config(["--config", str(ROOT / "configs" / "flux1.yaml"), *lora], cuda_available=True)
        return cfg, {p.weights: p for p in enumerate_plans(cfg, seq_len=4608, global_batch=world, world=world,
                                                           cps=("none",), weights=weights, memory_gib_limit=80)}
    _, full = plans()
    cfg, lora = plans("--lora-rank", "64")
    assert full["ddp"].pruned.startswith("does not fit") and lora["ddp"].pruned is None
    n, n_a = count_params(cfg), adapter_params(cfg.model, "attention", 64)
    assert n_a == 74_711_040  # rank 64 on Flux.1's fused attention projections (unfused, as diffusers: ~105 M)
    # the frozen linears keep no inputs for weight gradients: 12.5 units of activations a token a block, not 19.4
    acts = (19.4 - 12.5) * 2 * 3072 * 4608 * (19 + 38)
    assert full["ddp"].memory_gib - lora["ddp"].memory_gib == pytest.approx((3 * 2 * n - 2 * n - 3 * 2 * n_a + acts)
                                                                            / 2**30)
    _, sharded = plans("--lora-rank", "64", world=8, weights=("ddp", "fsdp"))
    assert sharded["fsdp"].memory_gib < sharded["ddp"].memory_gib < 0.95 * 80


def test_fp8_is_a_plan_axis():
    """--fp8 none,rowwise: each plan with and without FP8 linears (named -fp8<recipe>, its run setting; without
    checkpointing less memory than bf16's: torchao keeps the linears' inputs in float8, as measured at Flux.1's depth,
    31.6 against 37.7 GiB); on a CPU left out with why."""
    cfg = parse_config(["--config", str(ROOT / "configs" / "flux1.yaml")], cuda_available=True)
    plans = {p.fp8: p for p in enumerate_plans(cfg, seq_len=4608, global_batch=8, world=8, cps=("none",),
                                               weights=("fsdp",), memory_gib_limit=80, fp8=("none", "rowwise"))}
    assert plans["rowwise"].name == "dp8-fsdp-eager-fp8rowwise" and plans["rowwise"].settings["fp8"] == "rowwise"
    assert "fp8" not in plans["none"].settings and plans["none"].pruned is None
    assert plans["rowwise"].pruned is None and plans["rowwise"].memory_gib < plans["none"].memory_gib
    cpu = [p for p in enumerate_plans(cfg, seq_len=4608, global_batch=8, world=8, cps=("none",), weights=("fsdp",),
                                      on_gpu=False, fp8=("rowwise",))]
    assert cpu[0].pruned.startswith("--fp8 rowwise: float8 GEMMs need a GPU")


def test_compiled_per_block_is_a_build_where_the_step_graph_is_refused():
    """--builds compiled: per block without the step graph, the build of Flux.1's best plans (FSDP2 keeps a step out
    of one graph: the graph build of the same plan is left out with the run's own reason); on a CPU only listed."""
    cfg = parse_config(["--config", str(ROOT / "configs" / "flux1.yaml")], cuda_available=True)
    plans = {p.build: p for p in enumerate_plans(cfg, seq_len=4608, global_batch=32, world=8, cps=("none",),
                                                 weights=("fsdp",), memory_gib_limit=80, builds=("compiled", "graph"),
                                                 checkpointing=("selective",))}
    assert plans["compiled"].name == "dp8-fsdp-compiled-acselective" and plans["compiled"].pruned is None
    assert plans["compiled"].settings["compile"] is True and "step_graph" not in plans["compiled"].settings
    assert "--compile true" in command(plans["compiled"], "configs/flux1.yaml")
    assert plans["graph"].pruned is not None and "--step-graph" in plans["graph"].pruned
    r = subprocess.run([sys.executable, "scripts/plan.py", "--config", str(TINY), "--global-batch", "2", "--world",
                        "2", "--builds", "compiled"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2 and "--builds compiled: compiled builds run on a GPU" in r.stderr


def test_the_command_runs_the_plan_on_real_gpus():
    (p,) = [p for p in enumerate_plans(_cfg(), 144, 4, 4, on_gpu=False, cps=("ulysses",), weights=("zero2",))
            if p.cp_degree == 2]
    cmd = command(p, "configs/tiny.yaml")
    assert cmd.startswith("python scripts/train_bench.py --config configs/tiny.yaml --devices 4")
    assert "--data.global_batch 4 --cp ulysses --cp-degree 2 --weights zero2" in cmd
    assert "simulate" not in cmd


def test_plan_ranks_the_plans_it_ran_by_time_per_global_batch(tmp_path, capsys):
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
    # how sure: each plan's measured steps and its step's 95% interval, in plan.json and the table; neighbours whose
    # intervals overlap are a tie (=); the table names the link profile it priced with
    for row in ran:
        lo, hi = row["step_ms_ci95"]
        assert 2 <= row["steps"] <= 4 and lo <= row["step_ms"] <= hi and row["rank_step_ms_ci95"][0] <= lo + 1e-9
    text = " ".join(r.stdout.split())
    assert "links priced on h200-nvlink4" in text and "step ms (95% CI)" in text and d["link"] == "h200-nvlink4"
    tied = overlap(ran[0]["step_ms_ci95"], ran[1]["step_ms_ci95"])
    assert ran[0]["tied_with"] == ([ran[1]["plan"]] if tied else []) and d["summary"]["best_tied"] == tied
    assert ("= : within each other's noise" in text) == tied and (f"| 1= | {ran[0]['plan']}" in text.replace("│", "|")
                                                                   ) == tied
    # relative paths only: the runs beside plan.json, the command's config from the repository's root
    assert [row["run"] for row in ran] == [row["plan"] for row in ran]
    assert "--config configs/tiny.yaml" in ran[0]["command"]
    assert not [x for x in _strings(d) if x.startswith("/") or str(tmp_path) in x or str(ROOT) in x]
    # the report over the same folder carries the cell: report.json `plans`, ranked rows with tokens/s and MFU
    from flux_cp.report import build, write

    rep = json.loads(write(build(tmp_path), tmp_path / "report")["json"].read_text())
    (cell,) = rep["plans"]
    assert cell["cell"] == "S144-B2-W2" and [p["plan"] for p in cell["plans"][:2]] == [row["plan"] for row in ran]
    assert all("tokens_per_s_per_gpu" in p and "mfu" in p for p in cell["plans"][:2])
    # a --memory-gib its estimate fits under but its measured peak does not: that plan listed as over memory, never
    # a crash (the same command again: the runs are complete, so nothing runs again). On the CPU the estimate is
    # close to the live tensors' peak, so the run is made to have measured twice as much.
    top = max(ran, key=lambda row: row["peak_gib"])
    f = tmp_path / top["run"] / "summary.json"
    d = json.loads(f.read_text())
    d["memory"]["allocated_gib"] = top["peak_gib"] = 2 * top["peak_gib"]
    f.write_text(json.dumps(d))
    limit = top["peak_gib"] * 0.75
    rc, out, err = _plan_in_process(capsys, "--config", TINY, "--global-batch", 2, "--world", 2, "--cp",
                                    "none,allgather-kv", "--weights", "ddp", "--steps", 4, "--warmup-steps", 1,
                                    "--output", tmp_path, "--memory-gib", limit)
    rows = {row["plan"]: row for row in json.loads((tmp_path / "plan.json").read_text())["plans"]}
    assert rows[top["plan"]]["status"] == "over memory" and "rank" not in rows[top["plan"]], err[-1500:]
    assert rows[top["plan"]]["why"] == f"measured peak {top['peak_gib']:.3g} GiB > {limit:.3g} GiB a GPU"
    assert f"{top['plan']}: over memory: measured peak" in " ".join(err.split())
    assert rc == (0 if any(row["status"] == "ran" for row in rows.values()) else 1), err[-2000:]
    assert "Traceback" not in err
    # --measured: the same plans ranked from these runs, nothing run (a plan no run matches: not measured)
    rc, out, err = _plan_in_process(capsys, "--config", TINY, "--global-batch", 2, "--world", 2, "--cp",
                                    "none,allgather-kv", "--weights", "ddp,zero2", "--measured", tmp_path,
                                    "--output", tmp_path / "again")
    again = {row["plan"]: row for row in json.loads((tmp_path / "again" / "plan.json").read_text())["plans"]}
    assert rc == 0 and [again[row["plan"]]["step_ms"] for row in ran] == [row["step_ms"] for row in ran]
    assert again["dp2-zero2-eager"]["why"].startswith("not measured") and "measured: 2 plans" in err
    assert all(f.is_symlink() for f in (tmp_path / "again").iterdir() if f.name != "plan.json")  # none run
    assert (tmp_path / "again" / "dp2-ddp-eager").resolve() == (tmp_path / "dp2-ddp-eager").resolve()


def test_plans_within_each_others_noise_are_a_tie():
    """Neighbours in the ranking whose 95% intervals of the step overlap are tied (=); an interval comes from
    summary.json's steadiness, else from the per-step times; under 2 steps there is none (no tie claimed)."""
    rows = [{"plan": "a", "step_ms_ci95": [10.0, 12.0]}, {"plan": "b", "step_ms_ci95": [11.5, 13.0]},
            {"plan": "c", "step_ms_ci95": [12.5, 15.0]}, {"plan": "d", "step_ms_ci95": [16.0, 17.0]},
            {"plan": "e", "step_ms_ci95": None}]
    mark_ties(rows)
    assert [r["tied_with"] for r in rows] == [["b"], ["a", "c"], ["b"], [], []]
    assert confidence({"steadiness": {"n": 24, "ci95": [1, 2]}}) == (24, [1.0, 2.0])
    assert confidence({"per_step": {"step_ms": [5.0, 4.0, 6.0, 5.5, 5.2]}}) == (5, [4.0, 6.0])
    assert confidence({"per_step": {"step_ms": [5.0]}, "metrics": {"step_ms": {"n": 1}}}) == (1, None)


def test_what_cannot_run_is_listed_with_its_reason(capsys, tmp_path):
    """--dry-run names every plan left out and why; at W = 1 the strategies and weights modes no plan can take; on a
    CPU torch's ring (it needs CUDA)."""
    import torch

    rc, _, err = _plan_in_process(capsys, "--config", TINY, "--global-batch", 2, "--world", 1, "--dry-run")
    text = " ".join(err.split())
    assert rc == 0 and "left out --cp torch, --cp allgather-kv, --cp ulysses, --cp tp: one GPU" in text
    assert "left out --weights zero2, --weights zero2f, --weights fsdp: one GPU" in text
    if not torch.cuda.is_available():
        rc, _, err = _plan_in_process(capsys, "--config", TINY, "--global-batch", 2, "--world", 2, "--dry-run")
        text = " ".join(err.split())
        assert rc == 0 and ("left out dp1xtorch2-ddp-eager, dp1xtorch2-zero2-eager, dp1xtorch2-zero2f-eager, "
                            "dp1xtorch2-fsdp-eager, dp1xtorch2-fsdpoff-eager: --cp torch: torch's "
                            "context_parallel") in text
    assert list(tmp_path.iterdir()) == []


def test_the_default_output_is_git_ignored():
    import shutil

    assert _plan_script().DEFAULT_ROOT == Path("plans")
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "check-ignore", "-q", "plans/S144-B2-W2-20260101-000000/plan.json"], cwd=ROOT)
    assert r.returncode == 0, "plans/ is not in .gitignore"


def _plan_script():
    import importlib.util

    key = "plan_script_under_test"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "scripts" / "plan.py")
        sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[key])
    return sys.modules[key]


def _plan_in_process(capsys, *args) -> tuple[int, str, str]:
    """scripts/plan.py's main(argv) in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    rc = _plan_script().main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)


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
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"--map {tmp_path / 'none'}: not a folder" in r.stderr


def test_the_memory_estimate_is_within_10_percent_of_flux1s_measured_peaks():
    """Every Flux.1 plan run whole on the H100 (2026-12-07: FSDP over 8, 4608 tokens, 1-4 samples a rank, each
    checkpointing mode, eager and compiled; 2026-12-07d: FP8 linears, FSDP's kept blocks, 16896-98304 tokens over
    Ulysses x 8, LoRA at W = 1-8 with DDP, the ring and Ulysses; 2026-12-07f: LoRA with its base in FP8; on the H200,
    2026-12-07g: FP8 at four samples a rank, the full fine-tune at W = 1 under FSDP2's CPU offload, 4608 and 98304
    tokens): the planner's estimate of a rank's peak within 10% of the peak it measured."""
    import tarfile

    from flux_cp.plan.plans import run_memory_gib

    checked = []
    for runs, n in (("archive/2026-12-07-h100-flux1-checkpointing/runs.tar.xz", 13),
                    ("archive/2026-12-07d-h100-flux1-depth-lora/runs.tar.xz", 20),
                    ("results/2026-12-07f-h100-lora-fp8-cudnn/runs_call1.tar.xz", 3),  # LoRA with its base in FP8
                    ("results/2026-12-07g-h200-fp8-offload-cudnn/runs_calls.tar.xz", 7)):
        with tarfile.open(ROOT / "docs" / runs) as tar:
            found = 0
            for member in tar.getmembers():
                if not member.name.endswith("summary.json"):
                    continue
                d = json.load(tar.extractfile(member))
                # the one that ran out of memory: the estimate says so too (below); the target is Flux.1's depth
                if not d["complete"] or d["config"]["model"]["double_blocks"] != 19:
                    continue
                found += 1
                checked.append((member.name, run_memory_gib(d), d["memory"]["allocated_gib"]))
                assert abs(checked[-1][1] / checked[-1][2] - 1) <= 0.10, checked[-1]
            assert found == n
    cfg = parse_config(["--config", str(ROOT / "configs" / "flux1.yaml")], cuda_available=True)
    (oom,) = enumerate_plans(cfg, seq_len=4608, global_batch=32, world=8, cps=("none",), weights=("fsdp",))
    assert oom.memory_gib > 80  # four samples a rank without checkpointing: out of memory on the H100, as measured

def test_one_unwrapped_rank_holds_its_gradients_as_the_backward_frees_its_activations():
    """One rank without DDP (W = 1): its gradients, None after each step, fill as the backward frees the activations,
    so its peak holds the larger of the two, not both. The 2 + 4-block full fine-tune and LoRA at W = 1 on the H100
    (2026-12-07f: 11.0 and 4.9 GiB measured; adding the two was +16%): within 10%, under the measured peak."""
    import tarfile

    from flux_cp.plan.plans import run_memory_gib

    with tarfile.open(ROOT / "docs" / "results" / "2026-12-07f-h100-lora-fp8-cudnn" / "runs_call1.tar.xz") as tar:
        runs = [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith("summary.json")]
    shallow = [d for d in runs if d["config"]["model"]["double_blocks"] == 2]
    assert len(shallow) == 4 and {d["config"]["run"]["lora_rank"] for d in shallow} == {0, 64}
    for d in shallow:
        assert 0.90 <= run_memory_gib(d) / d["memory"]["allocated_gib"] <= 1.0, d["run_name"]


def test_the_flux1_map_is_ranked_from_the_suites_runs(tmp_path, capsys):
    """plan.py --measured over the H100 runs at Flux.1's depth (docs/archive 2026-12-07 and 2026-12-07d):
    each plan takes the run with its settings, nothing runs; one GPU holds no plan of the full fine-tune; at four
    samples a rank FP8 (tensorwise) is the best plan, plain FSDP data parallelism; one sample of 65536 tokens over
    Ulysses x 8."""
    import tarfile

    from flux_cp.plan.decision_map import load_map

    for page in ("archive/2026-12-07-h100-flux1-checkpointing", "archive/2026-12-07d-h100-flux1-depth-lora"):
        with tarfile.open(ROOT / "docs" / page / "runs.tar.xz") as tar:
            tar.extractall(tmp_path / "runs" / page, filter="data")
    rc, out, err = _plan_in_process(
        capsys, "--config", ROOT / "configs" / "flux1.yaml", "--cells", "4608:1:1 4608:4:4 4608:32:8 65536:1:8",
        "--cp", "none,ulysses", "--weights", "fsdp,ddp", "--builds", "eager,compiled", "--checkpointing",
        "none,selective,full", "--fp8", "none,rowwise,tensorwise", "--memory-gib", 80, "--measured", tmp_path / "runs",
        "--output", tmp_path / "map")
    by = {r["cell"]: r for r in load_map(tmp_path / "map")}
    assert by["S4608-B1-W1"]["best"] is None and by["S4608-B1-W1"]["none_because"] == "no plan fits a GPU's memory"
    assert by["S4608-B4-W4"]["none_because"].startswith("not measured; ")  # plans fit on paper, none ran yet
    b = by["S4608-B32-W8"]
    assert b["best"]["plan"] == b["data_parallel"]["plan"] == "dp8-fsdp-compiled-acselective-fp8tensorwise"
    assert b["runner_up"]["plan"] == "dp8-fsdp-compiled-acselective-fp8rowwise"
    assert b["device"] == "NVIDIA H100 80GB HBM3"
    assert b["best"]["tokens_per_s_per_gpu"] == pytest.approx(11846, rel=1e-3)
    assert by["S65536-B1-W8"]["best"]["plan"] == "dp1xulysses8-fsdp-compiled-acselective"
    assert "| 4608 | 1 | 1 | - (no plan fits a GPU's memory) |" in (tmp_path / "map" / "map.md").read_text()
    assert rc == 1 and "measured: 1 plan from runs under" in " ".join(err.split())  # W=1: none ran, so 1
    rc, out, err = _plan_in_process(capsys, "--cells", "4608:1:1", "--measured", tmp_path / "nowhere")
    assert rc == 2 and err.strip() == f"plan.py: error: --measured {tmp_path / 'nowhere'}: not a folder (give " \
        "folders holding runs' summary.json)"


def test_offloading_fsdp_is_planned_only_where_nothing_else_fits(capsys):
    """fsdpoff (--weights fsdp --fsdp-cpu-offload): Flux.1's full fine-tune on one GPU fits only so, its ~89 GiB of
    weights, gradients and AdamW state in host memory; ~100k tokens (98304) with full checkpointing too. Where fsdp
    (or at W = 1 ddp) fits, the offloading twin is left out with the reason; the largest block is a double block."""
    import torch

    from flux_cp.model import FluxDiT, num_params
    from flux_cp.plan.plans import block_params, host_gib

    cfg = parse_config(["--config", str(ROOT / "configs" / "flux1.yaml")], cuda_available=True)
    n = count_params(cfg)
    with torch.device("meta"):
        model = FluxDiT(cfg.model)
    assert block_params(cfg)[0] == pytest.approx(num_params(model.double_blocks[0]), rel=1e-3)

    def plans(seq_len, world, ac):
        return {p.weights: p for p in enumerate_plans(cfg, seq_len=seq_len, global_batch=world, world=world,
                                                       cps=("none",), builds=("compiled",), checkpointing=(ac,),
                                                       memory_gib_limit=80)}
    for seq_len, ac in ((4608, "none"), (98304, "full")):
        one = plans(seq_len, 1, ac)
        assert one["ddp"].pruned.startswith("does not fit") and one["fsdpoff"].pruned is None
        assert one["fsdpoff"].settings["fsdp_cpu_offload"] and one["fsdpoff"].memory_gib < 0.95 * 80
        assert host_gib(cfg, n, one["fsdpoff"]) == pytest.approx(4 * 2 * n / 2**30)  # params, grads, 2 moments
    eight = plans(4608, 8, "selective")
    assert eight["fsdp"].pruned is None
    assert eight["fsdpoff"].pruned == "fsdp fits: offloading would only add host copies and a CPU optimizer step"
    rc, out, _ = _plan_in_process(capsys, "--config", ROOT / "configs" / "flux1.yaml", "--seq-len", 98304,
                                  "--global-batch", 1, "--world", 1, "--builds", "compiled", "--checkpointing", "full",
                                  "--memory-gib", 80, "--dry-run")
    assert rc == 0 and f"dp1-fsdpoff-compiled-acfull: ~{one['fsdpoff'].memory_gib:.1f} GiB a rank estimated, " \
        f"~{4 * 2 * n / 2**30:.1f} GiB of host memory" in out
