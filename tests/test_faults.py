"""Faults injected into real runs (Lightning launches 2 gloo ranks; FLUX_CP_FAULT picks rank, step, kind):
each ends within a bound, non-zero, with what was measured in summary.json and no process left."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from callbacks.faults import SLEEPING
from flux_cp.runs.failures import EXIT_INTERRUPTED, EXIT_TIMEOUT

from .conftest import ROOT, SCRIPT, bench, free_port, leftover_processes

ARGS = ("--devices", 2, "--wandb-mode", "disabled", "--warmup-steps", 1, "--steps", 6)


def faulty(tmp_path, fault: str, *extra):
    marker = f"FLUX_CP_TEST_MARK={uuid.uuid4().hex}"
    t0 = time.monotonic()
    r = bench(*ARGS, "--output", tmp_path, *extra, timeout=120, env={"FLUX_CP_FAULT": fault, **_env(marker)})
    return r, time.monotonic() - t0, marker


def _env(marker: str) -> dict:
    k, v = marker.split("=")
    return {k: v}


def _summary(path):
    return json.loads((path / "summary.json").read_text())


def test_a_rank_raising_fails_the_run_and_keeps_its_steps(tmp_path):
    r, took, marker = faulty(tmp_path, "rank=1,step=3,kind=raise", "--timeout-s", 20)
    assert r.returncode == 1, r.stderr[-3000:]
    assert took < 60  # not the process-group timeout path
    d = _summary(tmp_path)
    assert d["complete"] is False and d["error_rank"] == 1 and d["error_kind"] == "failed"
    assert d["error"] == "InjectedFault: injected fault on rank 1 at step 3"
    assert len(d["loss"]) == 3 and sum(d["step_kinds"].values()) == 2  # steps 0-2 (0 is warm-up) were measured
    assert [e["error_rank"] for e in d["errors"]][0] == 1  # rank 0's consequent error comes second, if any
    assert not any("traceback" in e for e in d["errors"])  # summary.json: one line per error
    trace = json.loads((tmp_path / "error-rank1.json").read_text())["traceback"]  # the rank's file: all of it
    assert trace.startswith("Traceback") and "callbacks/faults.py" in trace and "InjectedFault" in trace
    assert leftover_processes(marker) == []


@pytest.mark.slow
def test_a_hung_rank_ends_the_run_after_the_timeout_and_is_named(tmp_path):
    r, took, marker = faulty(tmp_path, "rank=1,step=2,kind=hang", "--timeout-s", 20)
    assert r.returncode == EXIT_TIMEOUT, r.stderr[-3000:]
    assert 20 < took < 60
    d = _summary(tmp_path)
    assert d["complete"] is False and d["error_kind"] == "timeout"
    # the rank that hung, not rank 0 whose collective timed out waiting for it
    assert d["error_rank"] == 1 and d["error"].startswith("rank 1 stalled in step 2 at callbacks/faults.py:"), d
    assert "rank 1 stalled in step 2" in r.stderr.strip().splitlines()[-1]
    assert len(d["loss"]) == 2 and sum(d["step_kinds"].values()) == 1
    assert leftover_processes(marker) == [] and not list(tmp_path.glob(".heartbeat*"))


@pytest.mark.slow
def test_a_hung_rank_0_is_named(tmp_path):
    """Rank 1 times out first and names rank 0 from its heartbeat (Lightning's launcher then kills rank 0); if rank
    0's watchdog fires first, it finds itself stalled outside torch. Either way rank 0 is the run's error."""
    r, took, marker = faulty(tmp_path, "rank=0,step=2,kind=hang", "--timeout-s", 20)
    assert r.returncode != 0, r.stderr[-3000:]
    d = _summary(tmp_path)
    assert d["error_rank"] == 0 and "stalled in step 2 at callbacks/faults.py" in d["error"], d
    assert leftover_processes(marker) == []


@pytest.mark.slow
def test_a_killed_rank_is_named(tmp_path):
    """A rank killed from outside (as by the OOM killer) leaves no error of its own: the run's error names it."""
    r, took, marker = faulty(tmp_path, "rank=1,step=2,kind=kill", "--timeout-s", 30)  # start-up under load
    assert r.returncode == 1, r.stderr[-3000:]
    d = _summary(tmp_path)
    assert d["complete"] is False and d["error_rank"] == 1 and d["error"].startswith("rank 1 died, last seen in step")
    assert leftover_processes(marker) == []


def test_sigterm_flushes_an_incomplete_summary(tmp_path):
    marker = f"FLUX_CP_TEST_MARK={uuid.uuid4().hex}"
    env = {**os.environ, "MASTER_PORT": str(free_port()), "WANDB_SILENT": "true", "FLUX_CP_FAULT":
           "rank=0,step=2,kind=sleep,seconds=120", **_env(marker)}
    env.pop("LOCAL_RANK", None)
    cmd = [sys.executable, str(SCRIPT), *map(str, ARGS), "--output", str(tmp_path), "--timeout-s", 300]
    proc = subprocess.Popen(list(map(str, cmd)), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:  # until rank 0 sleeps inside step 2
            if (tmp_path / SLEEPING).exists():
                break
            time.sleep(0.2)
        assert (tmp_path / SLEEPING).exists(), "rank 0 never reached step 2"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)  # not the 120 s sleep, nor the 300 s timeout
    finally:
        proc.kill()
    assert rc == EXIT_INTERRUPTED, proc.stderr.read()[-3000:]
    d = _summary(tmp_path)
    assert d["complete"] is False and d["error_kind"] == "interrupted" and d["error"] == "Terminated: SIGTERM"
    assert len(d["loss"]) == 2 and sum(d["step_kinds"].values()) == 1
    assert leftover_processes(marker) == []


def test_a_full_disk_is_said_and_leaves_no_temp_files(tmp_path):
    """A file-size limit (as a full disk: the OS refuses the write) hit while rewriting summary.json."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))  # summary.json outgrows it within a few steps

    env = {**os.environ, "MASTER_PORT": str(free_port()), "WANDB_SILENT": "true"}
    cmd = [sys.executable, str(SCRIPT), "--wandb-mode", "disabled", "--steps", 8, "--output", tmp_path / "run"]
    r = subprocess.run(list(map(str, cmd)), env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
                       preexec_fn=limit)
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("train_bench.py: rank 0: run failed (failed): OSError: [Errno 27] File too large"), last
    assert "out of disk space, quota or file-size limit" in last and "Traceback" not in r.stderr
    assert not list((tmp_path / "run").glob(".*.tmp"))
    assert _summary(tmp_path / "run")["complete"] is False


def test_a_long_error_line_keeps_its_end():
    """torch.compile puts the user frames after the message, the innermost (where it failed) last: a long error's
    one line keeps its start and its end (an H200 run's line had lost the frame that failed)."""
    from flux_cp.runs.failures import error_line

    e = AssertionError("\n\nfrom user code:\n" + "  File x.py, line 1, in f\n" * 60 + "  File last.py, line 9, in g")
    line = error_line(e)
    assert len(line) <= 500 and line.startswith("AssertionError: from user code:") and line.endswith("line 9, in g")
    assert " ... " in line and error_line(ValueError("short")) == "ValueError: short"
