import atexit
import contextlib
import fcntl
import functools
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_bench.py"
TINY = ROOT / "configs" / "tiny.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_idle_servers: list = []  # warm servers not running a run: one per run at a time (tests start runs from threads)
_servers_lock = threading.Lock()
# at most two runs at once a test worker (a server each): on two cores more only share them, and each new server
# costs a cold start; a third concurrent run waits for one (the runs tests start together do not wait on each other)
_server_slots = threading.BoundedSemaphore(2)


@functools.cache
def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


# Runs of 3 or more ranks take the 2 cores alone: their ranks hand each collective between threads and processes
# (gloo), so sharing the cores with the other test worker's runs made them 6-10x slower (a dp x tp run of 4 ranks: 7 s
# alone, 59-75 s beside the other worker; two workers' sum of test time 868 s, one worker's 447 s). The other runs
# share the cores (a shared lock on a file every test worker opens).
_CORES_LOCK = Path(os.environ.get("TMPDIR", "/tmp")) / f"flux-cp-tests-{os.getuid()}.lock"


@contextlib.contextmanager
def _cores(ranks: int):
    fd = os.open(_CORES_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if ranks >= 3 else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _ranks(args) -> int:
    """--devices N of a run's arguments (1 without; the last one given wins, as on the command line)."""
    args = list(map(str, args))
    given = [v for k, v in zip(args, args[1:]) if k == "--devices" and v.isdigit()]
    return int(given[-1]) if given else 1


def bench(*args, timeout=300, env=None):
    """Run train_bench.py as a user would: a process of its own (Lightning launches the ranks), forked from a process
    that has done the imports where the run's environment allows (tests/forkserver.py), else started cold."""
    with _cores(_ranks(args)):
        return _bench(*args, timeout=timeout, env=env)


def _bench(*args, timeout=300, env=None):
    from tests.forkserver import ForkServer

    e = {**os.environ, "MASTER_PORT": str(free_port()), "WANDB_SILENT": "true", **(env or {})}
    e.pop("LOCAL_RANK", None)
    argv = [str(SCRIPT), *map(str, args)]
    # =1: never forked; nor where CUDA is visible (the GPU tests: a fork of a process whose imports touched CUDA
    # cannot use it, H100 2026-12-07)
    if os.environ.get("FLUX_CP_COLD_RUNS") == "1" or _cuda_visible() or not ForkServer.warm_enough(e):
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=e,
                              cwd=ROOT)
    with _server_slots:
        with _servers_lock:
            server = _idle_servers.pop() if _idle_servers else None
        if server is None or not server.alive:
            server = ForkServer(ROOT)
            atexit.register(server.close)
        try:
            return server.run(argv, e, ROOT, timeout)
        finally:
            if server.alive:
                with _servers_lock:
                    _idle_servers.append(server)


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


# Exact runs: fp64, 10 optimizer steps (state that carries across steps, e.g. AdamW's moments or a gradient that
# is not reset, shows from the third), every gradient of the first step and every parameter after the last saved.
EXACT = ("--config", TINY, "--precision", "64-true", "--steps", 9, "--warmup-steps", 1, "--dump-grads", "true",
         "--dump-params", "true", "--wandb-mode", "disabled")
EXACT_STEPS = 10


def exact_run(out: Path, *args) -> dict:
    """A train_bench run with EXACT settings (later args override them): summary.json, first-step gradients and
    final parameters, as {"summary", "grads", "params"}."""
    r = bench(*EXACT, "--output", out, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return load_exact(out)


def load_exact(out: Path) -> dict:
    import json

    import torch

    return {"summary": json.loads((out / "summary.json").read_text()), "grads": torch.load(out / "grads_step0.pt"),
            "params": torch.load(out / "params_final.pt")}


def assert_exact(got: dict, ref: dict, rtol: float, params_rtol: float = 1e-10) -> None:
    """Same losses at every step (relative), same first-step gradients and final parameters (relative to each
    tensor's largest entry: entries near zero carry the rounding of the large ones).

    Parameters get at least 1e-10: AdamW moves an entry whose gradient g nearly cancels by lr * g / (|g| + eps), so
    g's rounding (~1e-18 absolute in fp64) comes out of each step multiplied by lr / eps = 1e5 (measured: 5.7e-13
    relative after 10 steps at W=3, from one such entry; losses and gradients stay at ~1e-15)."""
    import torch

    loss, ref_loss = (torch.tensor(d["summary"]["loss"], dtype=torch.float64) for d in (got, ref))
    assert len(loss) == len(ref_loss) == EXACT_STEPS
    torch.testing.assert_close(loss, ref_loss, rtol=rtol, atol=0)
    for key, tol in (("grads", rtol), ("params", max(rtol, params_rtol))):
        assert got[key].keys() == ref[key].keys(), key
        for name, want in ref[key].items():
            torch.testing.assert_close(got[key][name], want, rtol=tol, atol=tol * want.abs().max().item(),
                                       msg=lambda m, n=name, k=key: f"{k} {n}: {m}")


@pytest.fixture(scope="session")
def single_process(tmp_path_factory):
    """The one-process reference of an exact run, by samples per step: batch_size 1 (what a CP group trains on)
    or 2 (dp=2 groups of batch 1). Run once per session and shared by the test files."""
    cache = {}

    def get(batch_size: int = 1) -> dict:
        if batch_size not in cache:
            out = tmp_path_factory.mktemp(f"single-b{batch_size}")
            cache[batch_size] = exact_run(out, "--devices", 1, "--data.batch_size", batch_size)
        return cache[batch_size]

    return get


def write(path, d):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(d if isinstance(d, str) else json.dumps(d))


@pytest.fixture(scope="session")
def train_runs(tmp_path_factory):
    """Three real CPU runs, made once a test worker (the report's tests read them): W=1 (--cp none), W=2
    (allgather-kv), and W=2 simulated in one process."""
    base = tmp_path_factory.mktemp("train")
    out = {}
    for name, args in ((1, ["--devices", 1, "--cp", "none"]), (2, ["--devices", 2, "--cp", "allgather-kv"]),
                       ("sim", ["--devices", 1, "--cp", "allgather-kv", "--simulate-world", 2])):
        r = bench(*args, "--wandb-mode", "disabled", "--group", "rpt", "--output", base / f"w{name}")
        assert r.returncode == 0, r.stderr[-3000:]
        out[name] = base / f"w{name}" / "summary.json"
    return out
