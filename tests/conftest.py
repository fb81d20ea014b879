import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_bench.py"
TINY = ROOT / "configs" / "tiny.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(*args, timeout=300, env=None):
    """Run train_bench.py as a user would: a real process (Lightning launches the ranks)."""
    e = {**os.environ, "MASTER_PORT": str(free_port()), "WANDB_SILENT": "true", **(env or {})}
    e.pop("LOCAL_RANK", None)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT
    )


def train_bench():
    """scripts/train_bench.py as a module (its main() is the command line's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_bench", SCRIPT)
    if "train_bench" not in sys.modules:
        sys.modules["train_bench"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["train_bench"])
    return sys.modules["train_bench"]


def main_in_process(*args) -> tuple[int, list[str]]:
    """train_bench's main() as the command line runs it: (exit code, stderr lines). For input refused before any
    rank starts; a real process costs seconds of imports per case on 2 cores."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = train_bench().main(list(map(str, args)))
    return rc, err.getvalue().strip().splitlines()


@pytest.fixture
def run_bench():
    return bench


def leftover_processes(marker: str) -> list[int]:
    """Pids of live processes whose environment holds `marker` (a run's ranks inherit the launcher's)."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if marker in {f"{k}={v}" for k, v in p.environ().items()}:
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):  # exited meanwhile, or not ours
            pass
    return found
