"""The entry point as a user meets it: summary.json, wandb offline files, run folders, bad-input errors, help."""

import json
import os
import re
from pathlib import Path

import psutil
import pytest

from flux_cp.runs.outputs import LOCK, RUN_DIR_ENV, claim
from flux_cp.runs.results import TRAIN_METRICS, validate

from .conftest import TINY, bench, main_in_process, train_bench


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One 2-rank run (no --config: the machine's default) shared by the tests that read it."""
    out = tmp_path_factory.mktemp("w2")
    r = bench("--devices", 2, "--output", out, "--wandb-mode", "offline", "--warmup-steps", 0)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def test_devices_2_on_cpu_writes_a_valid_summary(two_ranks):
    tmp_path, r = two_ranks
    assert "no GPU found: a tiny CPU config" in r.stderr
    assert "train_bench.py: warning: --warmup-steps 0: the first step" in r.stderr
    d = json.loads((tmp_path / "summary.json").read_text())
    assert validate(d) == []
    assert d["sdpa_backend"] == "auto"
    assert d["mode"] == "train" and d["world_size"] == 2 and d["cp"] == "allgather-kv" and d["complete"]
    steps = d["config"]["run"]["steps"]
    assert len(d["loss"]) == steps + d["config"]["run"]["warmup_steps"]
    kinds = d["step_kinds"]  # --regions-every 4 (default): op regions in measured steps 1, 5, ...; no probes on CPU
    assert kinds == {"plain": steps - (steps + 2) // 4, "timed": (steps + 2) // 4}, kinds
    for name in TRAIN_METRICS:
        m = d["metrics"][name]
        assert m["n"] == kinds["plain" if name in ("step_ms", "host_ms") else "timed"]
        assert 0 < m["min"] <= m["median"] <= m["max"]
        assert m["rank_min_median"] <= m["rank_max_median"]
    # the op regions are parts of the steps they were timed in (the timed steps: plain ones carry no regions and
    # run faster, so on a loaded 2-core CPU the regions' sum once passed the plain steps' median, 56.3 > 52.8 ms)
    ops = sum(d["metrics"][k]["median"] for k in TRAIN_METRICS[2:])
    assert ops < d["metrics"]["step_timed_ms"]["median"]
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
    assert not (tmp_path / LOCK).exists()  # released at exit


def test_a_run_prints_no_noise_and_ends_with_its_answer(two_ranks):
    """Quiet by default: no wandb banner, Lightning tip, deprecation warning, progress bar in a file, ANSI codes;
    the end says the step time (no W=1 baseline in this folder) and the next command."""
    _, r = two_ranks
    text = r.stdout + r.stderr
    for noise in ("wandb:", "litlogger", "GPU available", "deprecated", "Epoch", "\x1b[", "Traceback", "TypeError"):
        assert noise not in text, (noise, text[-3000:])
    lines = r.stdout.strip().splitlines()  # the result on stdout (`> log` keeps it), warnings on stderr
    assert "W=2: step" not in r.stderr
    # against the newest W=1 baseline under runs/ if this checkout has one (make bench makes one), else says so
    assert lines[-2].startswith("W=2: step "), lines[-2:]
    if "no W=1 baseline" in lines[-2]:
        assert lines[-1].startswith("next: python scripts/train_bench.py --devices 1 --cp none"), lines[-1]
    elif "which CP cannot" in lines[-2]:  # the baseline found beats W=2 by over 2x (a cold 1-step run): refused
        assert re.search(r"; \d+\.\dx against \S+ \(W=1\) would beat W=2 GPUs", lines[-2]), lines[-2:]
        assert lines[-1].endswith("--devices 1 --cp none   (the baseline, again)"), lines[-1]
    else:
        assert re.search(r", \d+\.\d\dx vs \S+ \(W=1\)", lines[-2]), lines[-2:]
        assert lines[-1].startswith("next: python scripts/report.py "), lines[-1]


def test_a_complete_run_is_never_overwritten(two_ranks):
    out, _ = two_ranks
    before = (out / "summary.json").read_text()
    rc, lines = main_in_process("--devices", 2, "--output", out)
    assert rc == 2 and lines == [
        f"train_bench.py: error: --output {out}: holds a complete run (its summary.json); add --overwrite to replace "
        "it, or leave --output out for a new folder"]
    assert (out / "summary.json").read_text() == before


def test_a_live_run_holds_its_folder(tmp_path):
    """The lock names a live process (this one): a second run is refused before any rank starts."""
    me = psutil.Process()
    (tmp_path / LOCK).write_text(json.dumps({"pid": me.pid, "started": me.create_time(), "since": "now"}))
    rc, lines = main_in_process("--output", tmp_path)
    assert rc == 2 and lines[0].startswith(f"train_bench.py: error: --output {tmp_path}: a live run (pid {me.pid}")


def test_default_folders_are_new_per_run_and_latest_points_at_the_newest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RUN_DIR_ENV, "")  # claim() tells the ranks it would start: not this process's later tests
    a, b = claim(None, "train-W1-none-s144", False), claim(None, "train-W1-none-s144", False)
    assert a != b and a.parent == b.parent == Path("runs/train-W1-none-s144")
    assert (a.parent / "latest").resolve() == b.resolve()
    # a stale lock (its process is gone) is taken over
    (b / LOCK).write_text(json.dumps({"pid": 2**22 + 1, "started": 0, "since": "then"}))
    assert claim(str(b), "x", False) == b and json.loads((b / LOCK).read_text())["pid"] == os.getpid()


def test_timing_off_keeps_step_metrics_only(tmp_path):
    """Also: a reused folder with --overwrite (its old record goes, wandb runs do not pile up)."""
    (tmp_path / "summary.json").write_text(json.dumps({"complete": True}))
    (tmp_path / "error-rank1.json").write_text("{}")
    (tmp_path / "wandb" / "offline-run-old").mkdir(parents=True)
    r = bench("--config", TINY, "--timing", "false", "--wandb-mode", "disabled", "--output", tmp_path,
              "--overwrite")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (tmp_path / "error-rank1.json").exists() and not (tmp_path / "wandb").exists()
    d = json.loads((tmp_path / "summary.json").read_text())
    assert set(d["metrics"]) == {"step_ms", "host_ms", "loop_ms", "data_ms", "transfer_ms", "prologue_ms",
                                 "after_ms", "gc_ms"}
    assert d["complete"] and d["metrics"]["data_ms"]["median"] > 0  # the next batch comes between steps
    ps = d["per_step"]
    # the loop's period holds the step's host time, step by step (medians over different step sets would not:
    # the last step has no loop period)
    assert all(loop > host for loop, host in zip(ps["loop_ms"], ps["host_ms"]))
    # the host's period, accounted whole: a step's host_ms + after_ms, then the next's data, transfer, prologue (the
    # parts share their stamps: nothing between them, however loaded the machine)
    for i in range(len(ps["loop_ms"]) - 1):
        nxt = sum(ps[k][i + 1] for k in ("data_ms", "transfer_ms", "prologue_ms"))
        parts = ps["host_ms"][i] + ps["after_ms"][i] + nxt
        assert abs(parts - ps["loop_ms"][i]) < 1e-6 * ps["loop_ms"][i], (i, parts, ps["loop_ms"][i])
    assert d["metrics"]["loop_ms"]["n"] == d["metrics"]["step_ms"]["n"] - 1  # the last step has no next one


def test_gc_every_collects_on_schedule_only(tmp_path):
    """--gc-every 3: no automatic collection in training; one after every 3rd step, in that step's loop period.
    With a loader worker: forked while the watchdog thread runs (it once shadowed Thread._stop: 'Event' TypeError)."""
    r = bench("--config", TINY, "--gc-every", 3, "--steps", 8, "--warmup-steps", 1, "--wandb-mode", "disabled",
              "--output", tmp_path, "--loader", "workers", "--num-workers", 1)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "not callable" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
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
    (["--config", "configs/sweep_cpu.yaml"], "a sweep file (a grid of runs), not a run's settings: run python "
     "scripts/sweep.py configs/sweep_cpu.yaml"),
    (["--devices", 2, "--cp-degree", 1, "--data.global_batch", 3], "--data.global_batch 3: each of the 2 "
     "data-parallel groups"),
    (["--model.num_hedz", 3], "num_hedz"),
    (["--cp", "ring"], "--cp ring: choose one of auto, torch, allgather-kv, ulysses, tp, none"),
    (["--precision", "fp8"], "--precision fp8: choose one of bf16-true, 32-true, 64-true"),
    (["--simulate-world", 2, "--contention", "true"], "--contention: a simulated rank's collectives put on its GPU as "
     "traffic, and there is no GPU here"),
    (["--steps", "many"], "--steps many: expected an integer"),
    (["--simulate-world", 2, "--devices", 2], "--simulate-world 2: this one process is a rank of the simulated job"),
    (["--simulate-world", 1], "--simulate-world 1: a simulated job has W >= 2 ranks"),
    (["--simulate-world", 4, "--simulate-rank", 4], "--simulate-rank 4: ranks of --simulate-world 4 run 0..3"),
    (["--simulate-rank", 1], "--simulate-rank 1: needs --simulate-world W"),
    (["--simulate-world", 8, "--cp", "ulysses"], "--model.num_heads 4 is not divisible by --simulate-world 8"),
    (["--simulate-world", 3, "--cp", "ulysses"], "(it shards heads: use a --simulate-world dividing 4, or --cp"),
    (["--simulate-world", 5], "not divisible by --simulate-world 5"),
    (["--compile", "true", "--warmup-steps", 1], "--warmup-steps 1: --compile"),
    (["--profile", "true", "--profile-steps", 0], "--profile-steps 0"),
    (["--sync-debug"], "--sync-debug: torch's sync debug mode watches CUDA calls"),
    (["--devices", 3, "--split-conditioning", "true"], "--split-conditioning: the modulation linears' widths"),
    (["--gc-every", -1], "--gc-every -1: 0 (Python's automatic collection)"),
    (["--model.num_heads", 0], "--model.num_heads 0: must be >= 1"),
    (["--model.head_dim", 7], "--model.head_dim 7: must be even"),
    (["--model.rope_axes", "[4,4,4]"], "--model.rope_axes [4, 4, 4]: three even sizes (text/index, row, col) summing"),
    (["--model.single_blocks", 0, "--model.double_blocks", 0], "--model.double_blocks 0 --model.single_blocks 0:"),
    (["--data.text_tokens", 0], "--data.text_tokens 0: must be >= 1"),
    (["--num-workers", 2], "--num-workers 2: worker processes make batches with --loader workers only"),
    (["--sigterm-every", 0], "--sigterm-every 0: a number of steps >= 1"),
    (["--zero-bucket-view", "true"], "--zero-bucket-view true: ZeRO's flat parameter buffers need --weights zero"),
    (["--zero2-gather", "forward"], "--zero2-gather forward: where ZeRO-2 gathers its parameters needs --weights"),
    (["--weights", "zero2", "--zero2-forward-share", 0.5], "--zero2-forward-share 0.5: the share of ZeRO-2's buckets"),
    (["--zero2-bucket-mb", 4], "--zero2-bucket-mb 4.0: the size of ZeRO-2's buckets, > 0, with --weights zero2"),
    (["--ulysses-overlap", "true"], "--ulysses-overlap true: overlaps Ulysses' fused q/k/v all-to-all with the MLP"),
    (["--weights", "fsdp", "--grad-bucket-view", "true"], "--grad-bucket-view true: gradients in DDP's all-reduce"),
    (["--interleave-bare", 1], "--interleave-bare 1: 0 (off) or blocks of >= 2 steps"),
    (["--interleave-bare", 2, "--harness", "bare"], "--interleave-bare 2: a bare twin inside a Lightning run"),
    (["--harness", "bare", "--profile", "true"], "--profile True: a setting of the Lightning harness"),
    (["--harness", "bare", "--ops-only"], "--harness bare: the op bench has no harness"),
    (["--ops-only", "--micro-batches", 2], "--micro-batches 2: the op bench times single calls at --data.batch_size"),
    (["--step-graph", "true"], "--step-graph: CUDA graphs need a GPU (drop --step-graph on CPU)"),
    (["--ops-only", "--seq-lens", 10], "--seq-lens 10: shorter than the text tokens (data.text_tokens 48)"),
]


@pytest.mark.parametrize(("settings", "message"), [
    ({"harness": "lightning", "interleave_bare": 4}, "the bare twin would need a graph of its own"),
    ({"harness": "lightning"}, None),
    ({"weights": "fsdp"}, "FSDP2 frees and gathers its shards"),
    ({"compile": True, "compile_mode": "reduce-overhead"}, "reduce-overhead's own CUDA graphs cannot nest"),
    ({"compile": True, "compile_mode": "max-autotune"}, "max-autotune's own CUDA graphs cannot nest"),
    ({"compile": True, "compile_mode": "max-autotune-no-cudagraphs"}, None),
    ({"warmup_steps": 11}, "--warmup-steps 11: it captures at the last warm-up step.*use >= 12"),
    ({"simulate_world": None, "cp": "none", "warmup_steps": 2}, "--warmup-steps 2: .*use >= 3"),
    ({"simulate_world": None, "cp": "none", "warmup_steps": 3}, None),
    ({}, None),
])
def test_step_graph_settings_are_checked_up_front(settings, message):
    """--step-graph's limits (GPU settings: no device needed to check them), each refused in one line naming the
    setting and the fix; what it can capture passes (a simulated Ulysses rank after 12 warm-up steps)."""
    from flux_cp.checks import _check_step_graph
    from flux_cp.config import ConfigError, RunConfig

    run = RunConfig(**({"accelerator": "gpu", "harness": "bare", "step_graph": True, "warmup_steps": 12,
                        "cp": "ulysses", "simulate_world": 2} | settings))
    if message is None:
        _check_step_graph(run)
        return
    with pytest.raises(ConfigError, match=f"^--step-graph: {message}"):
        _check_step_graph(run)


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    rc, lines = main_in_process(*args, "--output", tmp_path / "run")
    assert rc == 2
    assert len(lines) == 1 and lines[0].startswith("train_bench.py: error: ") and message in lines[0], lines
    assert not (tmp_path / "run").exists()  # nothing ran, not even the folder


@pytest.mark.parametrize(("output", "message"), [
    ("file", "a file is in the way"),
    ("file/run", "cannot create the folder (Not a directory)"),
    ("/proc/flux-cp-run", "cannot create the folder"),
])
def test_an_output_that_cannot_be_written_is_refused_up_front(tmp_path, output, message):
    (tmp_path / "file").write_text("")
    out = output if output.startswith("/") else tmp_path / output
    rc, lines = main_in_process("--output", out)
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"train_bench.py: error: --output {out}: {message}")


def test_the_real_command_fails_in_one_line(tmp_path):
    """The same, as a user's process: --model.num_heads 0 used to end in a wandb ConnectionResetError traceback."""
    r = bench("--model.num_heads", 0, "--output", tmp_path / "run")
    assert r.returncode == 2 and r.stderr.splitlines() == ["train_bench.py: error: --model.num_heads 0: must be >= 1"]


def test_help_describes_groups_and_where_defaults_come_from(capsys):
    with pytest.raises(SystemExit) as e:
        train_bench().main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "Defaults shown are configs/tiny.yaml's (no GPU on this machine" in " ".join(out.split())
    for title in ("Model dimensions", "Synthetic batches", "Run:", "Parallelism:", "Timing and profiling:",
                  "Compile:", "Op bench (--ops-only):", "Output:"):
        assert title in out, title
    assert "<class" not in out and "--print-config" in out
    # every option has its description, and defaults are tiny.yaml's (fp32, 48 steps), not the dataclasses'
    flat = " ".join(out.split())
    assert "measured steps (type: int, default: 48)" in flat and "default: 32-true)" in flat
    from flux_cp.config import _parser

    options = [a for a in _parser()._actions if a.option_strings and a.dest not in ("help", "model", "data")]
    assert len(options) > 40 and [a.dest for a in options if not a.help] == []


@pytest.mark.parametrize(("args", "backend"), [
    (["--cp", "torch", "--precision", "32-true"], "efficient"),
    (["--cp", "allgather-kv", "--precision", "64-true"], "math"),
    (["--cp", "torch", "--precision", "bf16-true"], "auto"),  # the strategy pins flash itself
    (["--cp", "ulysses", "--precision", "32-true"], "auto"),
])
def test_gpu_strategies_that_pin_flash_get_an_exact_kernel_outside_bf16(args, backend):
    """The ring and allgather-kv pin flash on CUDA (cuDNN faults under them on torch 2.11); fp32/fp64 have no
    flash kernel (the ring's fp32 run on the H200 failed with "No available kernel"): auto picks the next exact
    one, and an explicit flash is refused in one line naming the fix."""
    from flux_cp.checks import resolve
    from flux_cp.config import ConfigError, parse_config

    def resolved(*a):
        return resolve(parse_config(["--config", str(TINY), *a], cuda_available=True), cuda_available=True, gpu_count=1)

    assert resolved("--accelerator", "gpu", *args).run.sdpa_backend == backend
    if backend in ("efficient", "math"):
        with pytest.raises(ConfigError, match=f"--sdpa-backend flash: no .* kernel .* or --sdpa-backend {backend}"):
            resolved("--accelerator", "gpu", *args, "--sdpa-backend", "flash")


def test_ring_with_the_efficient_kernel_needs_per_rank_tokens_in_32s():
    """torch's ring merges chunks by logsumexp, which the memory-efficient kernel pads to 32 rows: the H200 run of
    the tiny fp32 config at W=4 (36 tokens per rank) failed inside the ring with "64 vs 36". Refused up front,
    naming the fix; bf16 (flash) and lengths in 32s per rank pass."""
    from flux_cp.checks import resolve
    from flux_cp.config import ConfigError, parse_config

    def resolved(*a):
        return resolve(parse_config(["--config", str(TINY), "--accelerator", "gpu", "--cp", "torch", *a],
                                    cuda_available=True), cuda_available=True, gpu_count=1)

    with pytest.raises(ConfigError, match=r"36 tokens per rank .* multiple of 32 .* --precision bf16-true"):
        resolved("--precision", "32-true", "--simulate-world", "4")
    assert resolved("--precision", "bf16-true", "--simulate-world", "4").run.sdpa_backend == "auto"
    assert resolved("--precision", "32-true").run.sdpa_backend == "efficient"  # W=1: one chunk, nothing to merge
    # 16 x 8 image + 64 text tokens: 96 per rank at W=2
    assert resolved("--precision", "32-true", "--simulate-world", "2", "--data.image_height", "16",
                    "--data.text_tokens", "64").run.sdpa_backend == "efficient"
    with pytest.raises(ConfigError, match="multiple of 32"):
        resolve(parse_config(["--config", str(TINY), "--accelerator", "gpu", "--ops-only", "--cp", "torch",
                              "--simulate-world", "1,2", "--seq-lens", "144", "--sdpa-backend", "efficient"],
                             cuda_available=True), cuda_available=True, gpu_count=1)


def test_docs_links_resolve_inside_the_repo():
    """Every relative link of README.md and docs/*.md points at a file of this checkout (a clone has no ../shared)."""
    import re

    from .conftest import ROOT

    for md in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)\)", md.read_text()):
            if "://" in target:
                continue
            assert (md.parent / target).exists(), f"{md.name}: link {target} does not resolve"
        assert "../shared" not in md.read_text(), md.name


def test_gpu_session_without_a_gpu_fails_fast_and_leaves_nothing(tmp_path):
    """tools/gpu_session.sh on a machine with no GPU: one line, a non-zero exit, no process left behind."""
    import subprocess

    from .conftest import ROOT, leftover_processes

    marker = f"FLUX_CP_TEST_MARK=gpu-session-{tmp_path.name}"
    env = {**__import__("os").environ, "OUT": str(tmp_path / "out"), "FLUX_CP_TEST_MARK": marker.split("=", 1)[1]}
    r = subprocess.run(["bash", str(ROOT / "tools" / "gpu_session.sh"), "flux_user"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "gpu_session.sh: no CUDA device is visible here: run it on the GPU machine"]
    assert leftover_processes(marker) == [] and not (tmp_path / "out").exists()


def test_host_slowdown_pins_the_run_beside_a_busy_loop_and_leaves_nothing(tmp_path):
    """--host-slowdown 1.5 (an emulated host of 2/3 the speed): the run trains with its threads on one core beside a
    busy loop at nice 3 (CFS weight 526 against its 1024), records the setting and what it applied for the report's
    regimes, probes the host before and after its steps, and no spinner outlives it. More than one process is
    refused before anything starts."""
    import os
    import uuid

    from .conftest import leftover_processes

    marker = f"FLUX_CP_TEST_MARK={uuid.uuid4().hex}"
    env = {**os.environ, "FLUX_CP_TEST_MARK": marker.split("=", 1)[1]}
    r = bench("--config", TINY, "--host-slowdown", 1.5, "--steps", 2, "--wandb-mode", "disabled", "--harness", "bare",
              "--output", tmp_path / "many", env=env | {"OMP_NUM_THREADS": "2"})
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
        "train_bench.py: error: --host-slowdown 1.5: this CPU run computes on 2 threads"), r.stderr[-2000:]
    r = bench("--config", TINY, "--host-slowdown", 1.5, "--steps", 2, "--wandb-mode", "disabled", "--harness", "bare",
              "--output", tmp_path / "run", env=env | {"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert d["complete"] and d["config"]["run"]["host_slowdown"] == 1.5
    assert d["host_load"]["spinner_nice"] == [3] and d["host_load"]["nominal_share"] == 1024 / (1024 + 526)
    assert all(d["host_speed"][k]["mean_us"] > 0 for k in ("before", "after"))
    # CUDA's launch queue as the run set it before CUDA started (4x: the idle probe does not stall), or the user's
    assert d["launch_queue"] == os.environ.get("CUDA_SCALE_LAUNCH_QUEUES", "4x")
    assert leftover_processes(marker) == []
    r = bench("--config", TINY, "--host-slowdown", 2, "--devices", 2, "--output", tmp_path / "two",
              env=env | {"OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
        "train_bench.py: error: --host-slowdown 2: emulated for one process"), r.stderr[-2000:]


def test_slowed_host_runs_its_spinners_on_the_pinned_core_and_restores_affinity():
    import os

    import psutil

    from flux_cp.measure.host_load import slowed_host

    before = os.sched_getaffinity(0)
    me = psutil.Process()
    others = {p.pid for p in me.children()}  # e.g. the tests' warm fork server (tests/forkserver.py)
    with slowed_host(3) as core:  # whole K: K - 1 loops at this process's weight, as before fractional settings
        spinners = [p for p in me.children() if p.pid not in others]
        assert len(spinners) == 2 and all(p.cpu_affinity() == [core] for p in spinners)
        assert all(p.nice() == me.nice() for p in spinners)
        assert all(os.sched_getaffinity(int(t)) == {core} for t in os.listdir("/proc/self/task"))
    assert os.sched_getaffinity(0) == before and not any(p.is_running() and p.status() != "zombie" for p in spinners)
    with slowed_host(2.5) as core:  # one loop at nice 0, one at nice 3 (weight 526: nearest 1024 x 0.5)
        spinners = [p for p in me.children() if p.pid not in others]
        assert sorted(p.nice() - me.nice() for p in spinners) == [0, 3]
        assert all(p.cpu_affinity() == [core] for p in spinners)
    assert os.sched_getaffinity(0) == before and not any(p.is_running() and p.status() != "zombie" for p in spinners)


def test_host_slowdown_takes_a_fraction_and_refuses_bad_values_in_one_line(monkeypatch):
    """The busy loops' nice levels give ~1/K of the core (Linux's CFS weights, nearest level); whole K as before.
    Values under 1, not a number, or above the cap are refused before anything starts, in one line."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a CPU run on several threads is refused
    from flux_cp.checks import MAX_HOST_SLOWDOWN, resolve
    from flux_cp.config import ConfigError, parse_config
    from flux_cp.measure.host_load import applied, plan

    def resolved(k):
        return resolve(parse_config(["--config", str(TINY), "--host-slowdown", str(k)], cuda_available=False),
                       cuda_available=False, gpu_count=0)

    assert resolved(1.25).run.host_slowdown == 1.25 and resolved(2).run.host_slowdown == 2.0
    assert plan(1.25)["spinner_nice"] == [6] and plan(1.25)["nominal_slowdown"] == pytest.approx((1024 + 272) / 1024)
    assert plan(2)["spinner_nice"] == [0] and plan(2)["nominal_share"] == 0.5 and plan(3)["spinner_nice"] == [0, 0]
    assert applied(1) is None and applied(1.001) is None  # nothing to run: the host as it is
    for bad, why in ((0.5, f"a number from 1 to {MAX_HOST_SLOWDOWN}"), (MAX_HOST_SLOWDOWN + 1, "a number from 1"),
                     ("nan", "expected a number"), ("inf", "expected a number")):  # the last two: the parser's
        with pytest.raises(ConfigError) as e:
            resolved(bad)
        assert str(e.value).startswith(f"--host-slowdown {bad}: {why}") and "\n" not in str(e.value), e.value


def test_help_speaks_a_users_words():
    """--help names settings and what they do: no internal constants, dates, module paths or jsonargparse's
    generic wording."""
    import re

    r = bench("--help", timeout=120)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())  # argparse wraps lines
    for bad in ("DDP_WEIGHTS", "Path to a configuration file", "flux_cp", "issue "):
        assert bad not in text, bad
    assert not re.search(r"20\d\d-\d\d-\d\d", text) and not re.search(r"\b\w+/\w+\.py\b", text), text
    assert "--model CONFIG a YAML holding model settings alone" in text


def test_a_summarys_config_reads_back_as_the_config():
    """config_from_summary (tools/memory_check.py): to_dict's output back whole; a key no longer a setting dropped, a
    setting an older run lacked at the value it ran with."""
    from flux_cp.config import BEFORE_SETTING, config_from_summary, parse_config

    cfg = parse_config(["--config", str(TINY), "--lora-rank", "4"], cuda_available=False)
    d = cfg.to_dict()
    back = config_from_summary(d)
    assert (back.model, back.data, back.run) == (cfg.model, cfg.data, cfg.run)
    d["run"]["a_retired_setting"] = 1
    del d["run"]["ulysses_qkv"]
    assert config_from_summary(d).run.ulysses_qkv == BEFORE_SETTING["ulysses_qkv"]
