"""scripts/sweep.py end to end: a run that runs out of memory is recorded and the sweep goes on; a
second invocation resumes (skips complete runs); a bad sweep config is reported whole, nothing runs."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flux_cp.config import ConfigError
from flux_cp.runs.sweep import Runner, classify
from flux_cp.runs.sweep_config import load_sweep

from .conftest import ROOT, TINY, leftover_processes

SWEEP = ROOT / "scripts" / "sweep.py"


def sweep(*args, env=None, timeout=300):
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, str(SWEEP), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=ROOT)


@pytest.mark.slow
def test_oom_is_recorded_the_sweep_goes_on_and_resumes(tmp_path):
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: t\nconfig: {TINY}\ntimeout_s: 60\nbase: {{wandb_mode: disabled, steps: 3}}\n"
                   "axes:\n  devices: [2, 1]\n  cp: [allgather-kv]\n")
    out = tmp_path / "out"
    marker = uuid.uuid4().hex
    # rank 1 exists only in the 2-rank run: it runs out of memory at step 2, the 1-rank run after it is fine
    r = sweep(cfg, "--output", out, env={"FLUX_CP_FAULT": "rank=1,step=2,kind=oom", "FLUX_CP_TEST_MARK": marker})
    assert r.returncode == 1, r.stderr[-3000:]
    index = json.loads((out / "sweep.json").read_text())
    assert index["status"] == "failed" and index["counts"] == {"oom": 1, "ok": 1}
    assert r.stderr.strip().splitlines()[-1] == f"report: python scripts/report.py {out}"  # whole, on its own line
    runs = {x["name"]: x for x in index["runs"]}
    w2, w1 = runs["devices-2_cp-allgather-kv"], runs["devices-1_cp-allgather-kv"]
    assert w2["status"] == "oom" and "can't allocate memory" in w2["error"]
    assert w2["shape"] == {"seq_len": 144, "batch": 1, "world": 2}
    s2 = json.loads((out / w2["name"] / "summary.json").read_text())
    assert s2["complete"] is False and s2["error_kind"] == "oom" and s2["shape"] == w2["shape"]
    assert len(s2["loss"]) == 2  # the steps before the failing one
    assert w1["status"] == "ok" and w1["error"] is None and w1["duration_s"] > 0
    assert json.loads((out / w1["name"] / "summary.json").read_text())["complete"] is True
    assert leftover_processes(marker) == []

    r = sweep(cfg, "--output", out)  # resume: only the incomplete run runs again
    assert r.returncode == 0, r.stderr[-3000:]
    index = json.loads((out / "sweep.json").read_text())
    assert index["status"] == "complete" and index["counts"] == {"ok": 2}
    runs = {x["name"]: x for x in index["runs"]}
    assert runs[w1["name"]]["status"] == "ok" and runs[w2["name"]]["status"] == "ok"
    assert runs[w1["name"]]["finished"] == w1["finished"] is not None  # when it ran, not when it was skipped
    assert runs[w1["name"]]["duration_s"] == w1["duration_s"]
    assert json.loads((out / w2["name"] / "summary.json").read_text())["complete"] is True


def test_a_bad_sweep_config_is_reported_whole_and_nothing_runs(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"config: {TINY}\ncolour: blue\naxes:\n  devices: [2, 3]\n  cp: [ulysses, torch]\n"
                   "  model.num_hedz: [4]\n  data.text_tokens: []\n  output: [x]\n")
    r = sweep(cfg, "--output", tmp_path / "out")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert "6 problem(s), nothing was run" in lines[0]
    for needle in ("unknown key 'colour'", "axes.data.text_tokens: empty axis", "unknown setting 'model.num_hedz'",
                   "axes.output: 'output' is set by the sweep", "--cp torch: torch's context_parallel",
                   "run devices-3_cp-ulysses: --model.num_heads 4 is not divisible by the CP degree 3"):
        assert sum(needle in ln for ln in lines[1:]) == 1, (needle, r.stderr)
    assert not (tmp_path / "out").exists()


def test_gpu_sweep_config_expands_on_an_8_gpu_host():
    sw = load_sweep(ROOT / "configs" / "sweep_flux.yaml", cuda_available=True, gpu_count=8)
    assert len(sw.runs) == 56 and {r.shape["seq_len"] for r in sw.runs} == {2560, 4608}
    assert not any(r.point["weights"] == "zero" and r.point["devices"] == 1 for r in sw.runs)
    with pytest.raises(ConfigError) as e:  # on one GPU: one line per impossible world size
        load_sweep(ROOT / "configs" / "sweep_flux.yaml", cuda_available=True, gpu_count=1)
    assert len(str(e.value).splitlines()) == 3


def test_a_run_that_completed_is_ok_whatever_ended_its_process():
    """Ctrl-C right after a run wrote its complete summary (exit 130 in teardown): ok, not failed."""
    assert classify(130, {"complete": True}, guard_fired=False) == "ok"
    assert classify(130, {"complete": False, "error_kind": "interrupted"}, guard_fired=False) == "failed"
    assert classify(0, None, guard_fired=False) == "failed"


def test_in_process_sweep_leaves_a_process_whose_cuda_state_is_lost(tmp_path):
    """A run that fails in the sweep's process with a CUDA error (on the H200, a failed CUDA graph capture made every
    later run in that process fail) sends the remaining runs to their own processes, which complete; a run that
    fails otherwise does not. The first run stands in for the failed capture (no CUDA here)."""
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: t\nconfig: {TINY}\ntimeout_s: 60\nbase: {{wandb_mode: disabled, steps: 2, devices: 1}}\n"
                   "axes:\n  harness: [bare, lightning]\n")
    for error, falls_back in (("CUDA error: operation failed due to a previous error during capture", True),
                              ("an ordinary failure", False)):
        calls = []

        def failing(argv, error=error, calls=calls):
            calls.append(argv)
            raise RuntimeError(error)

        out = tmp_path / ("cuda" if falls_back else "other")
        runner = Runner(load_sweep(cfg, str(out), cuda_available=False, gpu_count=0), in_process=failing)
        assert runner.run() == (1 if falls_back else 2)
        first, second = runner.records
        assert first["status"] == "failed" and error in first["error"]
        assert len(calls) == (1 if falls_back else 2) and runner.in_process is (None if falls_back else failing)
        if falls_back:
            assert second["status"] == "ok" and (Path(second["output"]) / "summary.json").is_file()


def test_a_resumed_sweep_runs_each_run_in_its_own_process_after_a_cuda_fault(tmp_path):
    """The sweep's process died of a CUDA fault after its run recorded it (H200 2026-12-07: cuDNN under LoRA, exit
    134 in a CUDA event's destructor, before the sweep could switch): the next attempt (gpu_session.sh resumes once)
    runs every run left in its own process, the faulted one included, and completes; an ordinary failure recorded
    keeps the runs in the sweep's process."""
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: t\nconfig: {TINY}\ntimeout_s: 60\nbase: {{wandb_mode: disabled, steps: 2, devices: 1}}\n"
                   "axes:\n  harness: [bare]\n")
    for error, own_processes in (("AcceleratorError: CUDA error: an illegal memory access was encountered", True),
                                 ("ValueError: an ordinary failure", False)):
        sweep = load_sweep(cfg, str(tmp_path / str(own_processes)), cuda_available=False, gpu_count=0)
        sweep.runs[0].output.mkdir(parents=True)
        (sweep.runs[0].output / "summary.json").write_text(json.dumps({"complete": False, "error": error}))
        calls = []
        runner = Runner(sweep, in_process=calls.append)
        assert (runner.in_process is None) == own_processes
        if own_processes:
            assert runner.run() == 0 and not calls and all(r["status"] == "ok" for r in runner.records)


@pytest.mark.slow  # sweeps of real runs: the slow set (make test-slow, CI)
def test_in_process_sweep_trains_as_separate_processes(tmp_path):
    """--in-process: every run in the sweep's own process (imports once): the same losses as one process per run,
    a sweep with a run of several processes is refused up front."""
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: t\nconfig: {TINY}\ntimeout_s: 60\nbase: {{wandb_mode: disabled, steps: 3, devices: 1}}\n"
                   "axes:\n  harness: [bare, lightning]\n")
    runs = {}
    for mode, args in (("in", ("--in-process",)), ("sub", ())):
        r = sweep(cfg, "--output", tmp_path / mode, *args)
        assert r.returncode == 0, r.stderr[-3000:]
        for f in (tmp_path / mode).glob("*/summary.json"):
            runs[mode, f.parent.name] = json.loads(f.read_text())
    names = {name for _, name in runs}
    assert len(names) == 2 and all(("in", n) in runs and ("sub", n) in runs for n in names)
    for n in names:
        run = runs["in", n]["config"]["run"]
        assert runs["in", n]["loss"] == runs["sub", n]["loss"], n
        assert len(runs["in", n]["loss"]) == run["warmup_steps"] + run["steps"], n
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"name: b\nconfig: {TINY}\nbase: {{wandb_mode: disabled}}\naxes:\n  devices: [1, 2]\n")
    r = sweep(bad, "--output", tmp_path / "bad", "--in-process")
    assert r.returncode == 2 and "--in-process: runs of several processes (devices-2)" in r.stderr


COMPILE_ONCE = """
import torch
from torch._dynamo.utils import counters
from flux_cp.train import compile_cache
print(compile_cache.load())
f = torch.compile(lambda x: (x.sin() * 2 + x.cos()).sum())
f(torch.randn(64))
print(compile_cache.save())
print("hits", counters["inductor"]["fxgraph_cache_hit"], "misses", counters["inductor"]["fxgraph_cache_miss"])
"""


@pytest.mark.slow  # two processes compiling on CPU: ~40 s
def test_compiled_artifacts_carry_to_a_fresh_process(tmp_path):
    """flux_cp/train/compile_cache.py: a process that compiles writes its artifacts (FLUX_CP_COMPILE_CACHE_OUT); a fresh
    one with its own, empty inductor cache directory loads them (FLUX_CP_COMPILE_CACHE_IN) and finds its graph
    cached, where without them it compiles (the device's calls each start on a fresh machine)."""
    art = tmp_path / "compile_cache.bin.xz"

    def run(name, **env):
        r = subprocess.run([sys.executable, "-c", COMPILE_ONCE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env=os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name), **env})
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip().splitlines()

    first = run("a", FLUX_CP_COMPILE_CACHE_OUT=str(art))
    assert first[0] == "None" and first[1].startswith("compile cache:") and first[2] == "hits 0 misses 1"
    assert art.stat().st_size > 0
    # as gpu_session.sh names them: a glob (each call's file kept under its own name)
    second = run("b", FLUX_CP_COMPILE_CACHE_IN=str(tmp_path / "*.bin.xz"),
                 FLUX_CP_COMPILE_CACHE_OUT=str(tmp_path / "again.bin.gz"))
    assert second[0].startswith("compile cache: 2 artifacts loaded") and second[-1] == "hits 1 misses 0"
    assert second[1] == "None"  # nothing new compiled: nothing written again
    cold = run("c", FLUX_CP_COMPILE_CACHE_IN=str(tmp_path / "missing.bin.gz"))
    assert "not found" in cold[0] and cold[-1] == "hits 0 misses 1"


def test_every_suite_checks_out_on_the_one_gpu_device():
    """Every named suite (configs/suites/, what tools/gpu_session.sh runs on the lent H200) passes the checks each of
    its runs would meet on a one-GPU host, so a broken suite is found here, not in device time."""
    bad = {}
    for f in sorted((ROOT / "configs" / "suites").glob("*.yaml")):
        try:
            assert load_sweep(f, cuda_available=True, gpu_count=1).runs, f"{f.name}: no runs"
        except ConfigError as e:
            bad[f.name] = str(e)
    assert not bad, bad


# ---------------------------------------------------------------- include: points beyond the grid


INCLUDE = """name: inc
config: {tiny}
base: {{accelerator: cpu, wandb_mode: disabled, cp: allgather-kv}}
axes:
  devices: [2, 4]
  harness: [bare, lightning]
exclude: [{{devices: 4, harness: bare}}, {{cp: none, harness: lightning}}]
include:
  - {{devices: 1, cp: none}}
  - {{devices: 1, steps: [2, 3, null], harness: bare}}
"""


def test_include_adds_points_crossed_with_the_axes_they_do_not_name(tmp_path):
    """An include entry is a grid of its own over base: it fixes the axes it names, is crossed with the others, and
    its other keys are its points' settings (and names); its points run before the grid's; exclude applies to both
    (here on an include key, cp); a null setting is not passed (the config's value); sweep.json records each
    point."""
    cfg = tmp_path / "s.yaml"
    cfg.write_text(INCLUDE.format(tiny=TINY))
    sw = load_sweep(cfg, str(tmp_path / "out"), cuda_available=False, gpu_count=0)
    assert [r.name for r in sw.runs] == [
        "devices-1_harness-bare_cp-none",  # its lightning twin excluded by {cp: none, harness: lightning}
        "devices-1_harness-bare_steps-2", "devices-1_harness-bare_steps-3", "devices-1_harness-bare_steps-none",
        "devices-2_harness-bare", "devices-2_harness-lightning", "devices-4_harness-lightning"]
    runs = {r.name: r for r in sw.runs}

    def setting(run, flag):
        return run.args[len(run.args) - 1 - run.args[::-1].index(flag) + 1]  # the last one given wins

    assert setting(runs["devices-1_harness-bare_cp-none"], "--cp") == "none"
    assert setting(runs["devices-1_harness-bare_steps-2"], "--cp") == "allgather-kv"  # base
    assert setting(runs["devices-1_harness-bare_steps-3"], "--steps") == "3"
    assert runs["devices-1_harness-bare_cp-none"].point == {"devices": 1, "harness": "bare", "cp": "none"}
    assert runs["devices-2_harness-lightning"].point == {"devices": 2, "harness": "lightning"}
    assert "--steps" not in runs["devices-1_harness-bare_steps-none"].args
    assert runs["devices-1_harness-bare_steps-none"].steps == runs["devices-2_harness-bare"].steps  # tiny.yaml's
    assert [r.processes for r in sw.runs] == [1, 1, 1, 1, 2, 2, 4]
    Runner(sw).write_index(running=False)
    index = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [x["point"] for x in index["runs"]] == [r.point for r in sw.runs]
    assert all(x["status"] == "pending" and x["exit_code"] is None for x in index["runs"])


def test_a_bad_include_is_reported_whole(tmp_path):
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: b\nconfig: {TINY}\nbase: {{accelerator: cpu, cp: allgather-kv}}\n"
                   "axes:\n  devices: [1, 2]\n"
                   "include:\n  - {devices: 2}\n  - {model.num_hedz: 4}\n  - {harness: []}\n"
                   "exclude: [{steps: 3}]\n")
    with pytest.raises(ConfigError) as e:
        load_sweep(cfg, str(tmp_path / "out"), cuda_available=False, gpu_count=0)
    lines = str(e.value).splitlines()
    for needle in ("include[1].model.num_hedz: unknown setting", "include[2].harness: empty list",
                   "exclude[0].steps: not an axis or an include key",
                   "runs devices-2 and devices-2 have the same settings"):
        assert sum(needle in ln for ln in lines) == 1, (needle, lines)
    assert len(lines) == 4, lines
    cfg.write_text(f"name: b\nconfig: {TINY}\naxes:\n  devices: [1]\ninclude: [devices-2]\n")
    with pytest.raises(ConfigError, match="include: must be a list of non-empty mappings"):
        load_sweep(cfg, str(tmp_path / "out"), cuda_available=False, gpu_count=0)


def test_the_readme_cpu_sweep_logs_offline_wandb_runs():
    """configs/sweep_cpu.yaml (the README's sweep): every run logs an offline wandb run: a user has runs to compare."""
    sw = load_sweep(ROOT / "configs" / "sweep_cpu.yaml", cuda_available=False, gpu_count=0)
    assert len(sw.runs) == 4
    for run in sw.runs:
        i = run.args.index("--wandb-mode")
        assert run.args[i + 1] == "offline" and "--wandb-mode" not in run.args[i + 1:], run.args


# ---------------------------------------------------------------- the interrupt path


def test_a_resumed_sweep_keeps_what_sweep_json_recorded(tmp_path):
    """A run complete before (resume) is not run again and keeps every field sweep.json recorded of it: its exit
    code, when it ended, how long it took (and fields this version does not know); a run whose settings changed
    starts afresh."""
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: r\nconfig: {TINY}\nbase: {{accelerator: cpu, wandb_mode: disabled}}\n"
                   "axes:\n  harness: [bare, lightning]\n")
    out = tmp_path / "out"
    sw = load_sweep(cfg, str(out), cuda_available=False, gpu_count=0)
    bare, lit = sw.runs
    for run in sw.runs:  # both measured whole before
        run.output.mkdir(parents=True)
        (run.output / "summary.json").write_text(json.dumps({"complete": True}))
    prior = Runner(sw).records
    prior[0].update(status="ok", exit_code=0, finished="2026-12-05T01:02:03", duration_s=12.5, note="kept")
    prior[1]["args"] = ["--steps", "99"]  # recorded with other settings: not this run
    prior[1].update(status="ok", exit_code=0, finished="2026-12-05T01:02:04", duration_s=9.0)
    out.joinpath("sweep.json").write_text(json.dumps({"schema": 1, "runs": prior}))

    runner = Runner(load_sweep(cfg, str(out), cuda_available=False, gpu_count=0))
    assert runner.run() == 0
    index = json.loads((out / "sweep.json").read_text())
    assert index["status"] == "complete"
    kept, fresh = index["runs"]
    assert kept["name"] == bare.name and kept["args"] == bare.args
    assert (kept["status"], kept["exit_code"], kept["finished"], kept["duration_s"], kept["note"]) == (
        "ok", 0, "2026-12-05T01:02:03", 12.5, "kept")
    assert fresh["name"] == lit.name and fresh["args"] == lit.args and fresh["status"] == "ok"
    assert fresh["exit_code"] is None and fresh["duration_s"] is None and fresh["finished"] is not None


def test_every_attempt_keeps_its_exit_code_across_a_resume(tmp_path):
    """A run killed by SIGTERM (exit -15), then run whole by the resume: sweep.json's `exit_code` is the latest
    attempt's (0), and `attempts` keeps both, oldest first; a run done before the resume gains no attempt, and a
    record from before `attempts` starts them from its exit code. The runs are stand-ins in this process."""
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: a\nconfig: {TINY}\nbase: {{accelerator: cpu, wandb_mode: disabled, devices: 1}}\n"
                   "axes:\n  harness: [bare, lightning]\n")
    out = tmp_path / "out"
    outcomes = iter([(-15, False), (0, True), (0, True)])  # (exit code, summary complete) of each call, in order

    def stand_in(argv):
        rc, complete = next(outcomes)
        dest = Path(argv[argv.index("--output") + 1])
        (dest / "summary.json").write_text(json.dumps({"complete": complete}))
        return rc

    runner = Runner(load_sweep(cfg, str(out), cuda_available=False, gpu_count=0), in_process=stand_in)
    assert runner.run() == 2  # the first run killed: the sweep stops there, the second left pending
    first, second = json.loads((out / "sweep.json").read_text())["runs"]
    assert (first["exit_code"], first["status"]) == (-15, "failed") and second["attempts"] == []
    assert [(a["exit_code"], a["status"]) for a in first["attempts"]] == [(-15, "failed")]

    runner = Runner(load_sweep(cfg, str(out), cuda_available=False, gpu_count=0), in_process=stand_in)
    assert runner.run() == 0
    index = json.loads((out / "sweep.json").read_text())
    first, second = index["runs"]
    assert index["status"] == "complete" and first["exit_code"] == 0 and first["status"] == "ok"
    assert [(a["exit_code"], a["status"]) for a in first["attempts"]] == [(-15, "failed"), (0, "ok")]
    assert all(a["finished"] for a in first["attempts"]) and first["finished"] == first["attempts"][-1]["finished"]
    assert [(a["exit_code"], a["status"]) for a in second["attempts"]] == [(0, "ok")]

    # resumed again: both done before, nothing runs, nothing is added; a record from before attempts gets its one
    old = {**second, "attempts": None}
    del old["attempts"]
    index["runs"] = [first, old]
    (out / "sweep.json").write_text(json.dumps(index))
    runner = Runner(load_sweep(cfg, str(out), cuda_available=False, gpu_count=0), in_process=stand_in)
    assert runner.run() == 0
    first2, second2 = json.loads((out / "sweep.json").read_text())["runs"]
    assert first2["attempts"] == first["attempts"]
    assert second2["attempts"] == [{"exit_code": 0, "status": "ok", "finished": second["finished"]}]


@pytest.mark.slow  # sweeps of real runs: the slow set (make test-slow, CI)
def test_only_runs_a_slice_and_the_index_keeps_the_other_slices(tmp_path):
    """--only: the runs whose names match its globs run, the others do not; a second slice into the same folder
    keeps the first slice's records, so one sweep.json lists both, complete; a glob that matches nothing is refused
    in one line before anything runs."""
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: o\nconfig: {TINY}\ntimeout_s: 60\nbase: {{wandb_mode: disabled, steps: 2, devices: 1}}\n"
                   "axes:\n  harness: [bare, lightning]\n")
    out = tmp_path / "out"
    r = sweep(cfg, "--output", out, "--in-process", "--only", "harness-bare")
    assert r.returncode == 0, r.stderr[-3000:]
    index = json.loads((out / "sweep.json").read_text())
    assert [x["name"] for x in index["runs"]] == ["harness-bare"] and index["only"] == ["harness-bare"]
    assert (out / "harness-bare" / "summary.json").is_file() and not (out / "harness-lightning").exists()
    first = index["runs"][0]

    r = sweep(cfg, "--output", out, "--in-process", "--only", "*-light*")
    assert r.returncode == 0, r.stderr[-3000:]
    index = json.loads((out / "sweep.json").read_text())
    assert index["status"] == "complete" and index["counts"] == {"ok": 2}
    runs = {x["name"]: x for x in index["runs"]}
    assert runs["harness-bare"] == first  # kept as the first slice recorded it, not run again
    assert runs["harness-lightning"]["status"] == "ok"

    r = sweep(cfg, "--output", tmp_path / "none", "--only", "harness-bare,nothing-*")
    assert r.returncode == 2 and "--only: nothing-* match(es) no run of o" in r.stderr
    assert not (tmp_path / "none").exists()
    # several suites: a glob may name runs of one of them; a suite with no run chosen is left out
    other = tmp_path / "p.yaml"
    other.write_text(cfg.read_text().replace("name: o", "name: p").replace("harness: [bare, lightning]",
                                                                            "data.seed: [3, 4]"))
    r = sweep(cfg, other, "--output-root", tmp_path / "two", "--dry-run", "--only", "seed-4,harness-bare")
    assert r.returncode == 0, r.stderr[-3000:]
    assert [ln.split(":")[0] for ln in r.stdout.splitlines()] == ["harness-bare", "seed-4"]


@pytest.mark.slow  # three real runs, one interrupted, then resumed: ~1-2 min on 2 cores
def test_an_interrupted_sweep_says_how_to_resume_and_resuming_keeps_the_finished_runs(tmp_path):
    """Ctrl-C (SIGINT) mid-run: the sweep stops that run (SIGTERM to its process group), records it with the signal
    named once, leaves the rest pending and ends with the exact command that resumes it (exit 130). That command
    runs the rest; every run finished before keeps its exit code 0 in sweep.json (it was None after a resume). Runs
    log offline wandb runs, as the README's CPU sweep does."""
    import shlex
    import signal
    import time

    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: i\nconfig: {TINY}\ntimeout_s: 60\nbase: {{accelerator: cpu, wandb_mode: offline, "
                   "steps: 60}\naxes:\n  devices: [1, 2]\ninclude:\n  - {devices: 1, steps: 2}\n")
    out = tmp_path / "out"
    marker = uuid.uuid4().hex
    env = {**os.environ, "FLUX_CP_TEST_MARK": marker}
    proc = subprocess.Popen([sys.executable, str(SWEEP), str(cfg), "--output", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    long = out / "devices-1"
    deadline = time.monotonic() + 240
    while not (long / "summary.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # the 60-step run has started its steps (its summary.json is written before the first)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    lines = [ln for ln in err.strip().splitlines() if "━" not in ln]
    index = json.loads((out / "sweep.json").read_text())
    assert index["status"] == "interrupted" and index["counts"] == {"ok": 1, "failed": 1, "pending": 1}, index
    first, cut, rest = index["runs"]
    assert (first["name"], first["status"], first["exit_code"]) == ("devices-1_steps-2", "ok", 0)
    assert (cut["name"], cut["status"], cut["exit_code"]) == ("devices-1", "failed", 130)
    assert cut["error"] == "interrupted: the sweep got SIGINT (Ctrl-C) and stopped this run"
    assert f"[failed] 2/3 devices-1: {cut['error']}" in lines
    assert (rest["status"], rest["exit_code"]) == ("pending", None)
    assert sum("SIG" in ln for ln in lines) == 2, lines  # the failed run's line and the closing one
    assert lines[-2] == ("interrupted by SIGINT (Ctrl-C): 2 run(s) not done; the same command resumes (complete runs "
                         "are kept, not run again):")
    command = shlex.split(lines[-1].removeprefix("resume: "))
    assert lines[-1].startswith("resume: ") and command[1:] == ["scripts/sweep.py", str(cfg), "--output", str(out)]
    assert leftover_processes(marker) == []

    r = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    index = json.loads((out / "sweep.json").read_text())
    assert index["status"] == "complete" and index["counts"] == {"ok": 3}
    assert [x["exit_code"] for x in index["runs"]] == [0, 0, 0]
    again = index["runs"][0]
    assert (again["finished"], again["duration_s"]) == (first["finished"], first["duration_s"])  # not run again
    for x in index["runs"]:
        assert list((Path(x["output"]) / "wandb").glob("offline-run-*")), x["name"]
    assert leftover_processes(marker) == []


def test_the_suites_index_lists_every_suite_with_its_runs():
    """configs/suites/README.md's table names every suite file, once, with the number of runs it expands to on a
    one-GPU host; every name it gives as retired or merged is no longer a file unless it is a suite of today."""
    import re

    text = (ROOT / "configs" / "suites" / "README.md").read_text()
    files = {f.stem: f for f in (ROOT / "configs" / "suites").glob("*.yaml")}
    table = text.split("## Suites", 1)[1].split("##", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \|", table, re.M)
    assert sorted(n for n, _ in rows) == sorted(files), rows
    for name, runs in rows:
        assert len(load_sweep(files[name], cuda_available=True, gpu_count=1).runs) == int(runs), name
    older = text.split("## Merged", 1)[1]
    named = set(re.findall(r"`(flux_\w+)`", older))
    assert len(named - set(files)) >= 50 and all(not (ROOT / "configs" / "suites" / f"{n}.yaml").exists()
                                                 for n in named - set(files))


def test_gpu_session_refuses_a_suite_it_does_not_have_before_any_device_work(tmp_path):
    """tools/gpu_session.sh with a retired suite name stops at once (exit 2) and says where to look, before it
    creates $OUT or runs anything. CUDA's check passes here through a stand-in python3 that exits 0."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\nexit 0\n")
    (fake / "python3").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(out)}
    r = subprocess.run(["bash", str(ROOT / "tools" / "gpu_session.sh"), "tests", "flux_user", "flux_sim_eager"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "gpu_session.sh: no suite flux_sim_eager in configs/suites/ (configs/suites/README.md: the suites, and where "
        "retired or merged ones went)"], r.stderr
    assert not out.exists()
