"""train_bench.py runs as forks of a warm process: each run is its own process, started without the imports.

Nearly all of a CPU test run's time is process start-up: torch, Lightning, diffusers and wandb take ~4-5 s to import
on CI's two cores, the tiny model's steps well under one. A server process imports them once per test worker and
forks a child per run; the child sets the run's environment, working folder and standard streams, and runs the script
as `python scripts/train_bench.py ARGS` would (as __main__, its exit code, its atexit hooks). The ranks Lightning
launches from it are ordinary new processes. Runs whose environment acts at import time (OMP_NUM_THREADS,
PYTHON*, ...) or that look for their processes by environment (FLUX_CP_TEST_MARK: a fork's /proc environ is the
server's) start cold, as before.

    server = ForkServer(); r = server.run([script, *args], env, cwd, timeout)   # a subprocess.CompletedProcess
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile

COLD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHON", "LD_", "TORCH", "CUDA", "FLUX_CP_TEST_MARK")

SERVER = r"""
import json, os, signal, socket, sys
import torch, lightning, diffusers.models.transformers.transformer_flux, wandb, rich.console, psutil, jsonargparse
import flux_cp.checks, flux_cp.train.module, flux_cp.train.bare, callbacks
sock = socket.socket(fileno=int(sys.argv[1]))
reader = sock.makefile("r")
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
for line in reader:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the run
        sock.close()
        os.setpgid(0, 0)  # its own group: a timed-out run is killed with every rank it started
        os.chdir(req["cwd"])
        os.environ.clear(); os.environ.update(req["env"])
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd); os.close(f)
        sys.stdout = open(1, "w", buffering=1, closefd=False); sys.stderr = open(2, "w", buffering=1, closefd=False)
        sys.argv = req["argv"]
        code = 0
        try:
            import runpy
            runpy.run_path(req["argv"][0], run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        try:
            import threading, atexit
            threading._shutdown()  # as the interpreter's exit: non-daemon threads joined, then atexit hooks
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
    sock.sendall((json.dumps({"pid": pid}) + "\n").encode())
    _, status = os.waitpid(pid, 0)
    sock.sendall((json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n").encode())
"""


class ForkServer:
    def __init__(self, cwd):
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                     cwd=cwd, stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours
        self.reader = ours.makefile("r")

    @staticmethod
    def warm_enough(env: dict) -> bool:
        """The run's environment takes effect after the imports (else: a cold start)."""
        changed = {k for k, v in env.items() if os.environ.get(k) != v} | (os.environ.keys() - env.keys())
        return not any(k.startswith(COLD_ENV) for k in changed) and "FLUX_CP_TEST_MARK" not in env

    def run(self, argv: list[str], env: dict, cwd, timeout: float) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            req = {"argv": argv, "env": env, "cwd": str(cwd), "stdout": out, "stderr": err}
            self.sock.sendall((json.dumps(req) + "\n").encode())
            pid = json.loads(self.reader.readline())["pid"]
            self.sock.settimeout(timeout)
            try:
                rc = json.loads(self.reader.readline())["rc"]
            except (TimeoutError, OSError):
                os.killpg(pid, signal.SIGKILL)  # the run and the ranks it started
                self.close()  # a timed-out socket file reads no more: the caller starts another server
                raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err)) from None
            self.sock.settimeout(None)
            return subprocess.CompletedProcess([sys.executable, *argv], rc, _read(out), _read(err))

    @property
    def alive(self) -> bool:
        return self.sock.fileno() != -1 and self.proc.poll() is None

    def close(self):
        self.sock.close()  # the server's loop ends at end of input
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
