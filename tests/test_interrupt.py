"""The first Ctrl-C (SIGINT to the process group) or SIGTERM (to the launcher) ends a run within seconds, even inside
one long CPU backward, leaving summary.json `complete: false`, no lock, no heartbeat, no rank and no traceback."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, SCRIPT, TINY, free_port, main_in_process

# A step of tens of seconds on two CPU ranks: 4608 tokens of fp64 at hidden 512 (the interrupt lands inside it)
LONG_STEP = ("--config", TINY, "--devices", 2, "--precision", "64-true", "--model.num_heads", 8, "--model.head_dim",
             64, "--model.rope_axes", "[16,24,24]", "--data.image_height", 64, "--data.image_width", 64,
             "--data.text_tokens", 512, "--model.single_blocks", 4, "--steps", 3, "--warmup-steps", 1)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_run_stops_on_the_first_signal_inside_a_long_step(tmp_path, how):
    out = tmp_path / "run"
    env = {**os.environ, "MASTER_PORT": str(free_port()), "WANDB_SILENT": "true"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *map(str, LONG_STEP), "--output", str(out)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as a shell's job
    try:
        deadline = time.monotonic() + 240
        while not (out / ".heartbeat-rank1.json").exists():  # both ranks are training (start-up over)
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        time.sleep(5)  # inside the first step's forward or backward
        assert proc.poll() is None
        summary = json.loads((out / "summary.json").read_text())
        assert not summary["loss"], "the step finished before the signal: make LONG_STEP longer"
        t0 = time.monotonic()
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        group_gone = _group_gone(proc.pid, t0 + 10)
    finally:
        if proc.poll() is None or not _group_gone(proc.pid, time.monotonic()):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert group_gone, "ranks left running"
    assert "Traceback" not in err, err
    assert "stopping" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["error_kind"] == "interrupted"
    assert not (out / "run.lock").exists() and not list(out.glob(".heartbeat-rank*"))
    # the folder holds an incomplete run: taken, unless --overwrite
    rc, lines = main_in_process("--config", TINY, "--output", out, "--steps", 1, "--warmup-steps", 1)
    assert rc == 2 and "incomplete run (interrupted)" in lines[-1] and "--overwrite" in lines[-1]


def _group_gone(pgid: int, until: float) -> bool:
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > until:
            return False
        time.sleep(0.1)
