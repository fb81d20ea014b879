"""train_bench.py runs as forks of a warm process: each run is its own process, started without the imports.

Nearly all of a CPU test run's time is process start-up: torch, Lightning, diffusers and wandb take ~4-5 s to import
on CI's two cores, the tiny model's steps well under one. A server process (`python -m tests.forkserver FD`) imports
them once per test worker and forks a child per run; the child sets the run's environment, working folder and
standard streams, and runs the script as `python scripts/train_bench.py ARGS` would (as __main__, its exit code, its
atexit hooks).

The ranks a run launches (Lightning's launcher, the bare loop's) start warm too. Before the script runs, the run
forks a zygote (single-threaded, no torch op run yet: safe to fork) and becomes a child subreaper; each
`subprocess.Popen([python, some.py, ...])` of the run is sent to the zygote (its standard streams as descriptors),
which forks the rank through an intermediate that exits at once, so the rank is reparented to the run: the run's
Popen waits on, signals and kills it as on any child. The rank runs the script as the command line would, in the
environment, folder, session and streams Popen was given.

Cold starts, as a plain process: runs whose environment acts at import time (OMP_NUM_THREADS, PYTHON*, ...) or that
look for their processes by environment (FLUX_CP_TEST_MARK: a fork's /proc environ is the server's); a rank whose
environment differs from its run's in such a variable; a Popen with settings a fork cannot honour (preexec_fn,
pass_fds, user or group changes).

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
# read when CUDA starts, never at import: a run sets it for its ranks (flux_cp/measure/timing.py)
WARM_ANYWAY = ("CUDA_SCALE_LAUNCH_QUEUES",)
PR_SET_CHILD_SUBREAPER = 36


def warm_enough(env: dict, base: dict) -> bool:
    """A process in `env`, forked from one that imported in `base`, is as if started in `env`."""
    changed = {k for k, v in env.items() if base.get(k) != v} | (base.keys() - env.keys())
    return not any(k.startswith(COLD_ENV) for k in changed - set(WARM_ANYWAY))


class ForkServer:
    def __init__(self, cwd):
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], cwd=cwd, stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours
        self.reader = ours.makefile("r")

    @staticmethod
    def warm_enough(env: dict) -> bool:
        """The run's environment takes effect after the imports (else: a cold start)."""
        return warm_enough(env, dict(os.environ)) and "FLUX_CP_TEST_MARK" not in env

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
        self.reader.close()  # (the socket's file holds its descriptor open past sock.close())
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


# ---- the server's side (python -m tests.forkserver FD) ----

def run_script(argv: list[str], cwd: str, env: dict) -> None:
    """Run argv[0] as `python ARGV` would, in this forked process, then exit with its code."""
    import atexit
    import runpy
    import threading
    import traceback

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = list(argv)
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # as the interpreter's exit: non-daemon threads joined, then atexit hooks
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _zygote(conn: socket.socket) -> None:
    """Fork a rank per request ({argv, cwd, env, fds, session, group}, its streams' descriptors beside it); answer its
    pid once the rank is the run's child. Ends when the run closes its end."""
    while True:
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if not msg:
            os._exit(0)
        req = json.loads(msg)
        r, w = os.pipe()
        if os.fork() == 0:  # the intermediate: forks the rank and exits, so the rank is reparented to the run
            pid = os.fork()
            if pid == 0:
                conn.close()
                os.close(r)
                os.close(w)
                for fd, target in zip(fds, req["fds"]):
                    os.dup2(fd, target)
                for fd in set(fds) - set(req["fds"]):
                    os.close(fd)
                if req["session"]:
                    os.setsid()
                elif req["group"] != -1:
                    os.setpgid(0, req["group"])
                run_script(req["argv"], req["cwd"], req["env"])
            os.write(w, str(pid).encode())
            os._exit(0)
        os.close(w)
        for fd in fds:
            os.close(fd)
        pid = int(os.read(r, 32))
        os.close(r)
        os.wait()  # the intermediate: once it is gone, the rank's parent is the run (a subreaper)
        conn.send(str(pid).encode())


def _serve_ranks_warm(env0: dict) -> None:
    """This run's Popen([python, some.py, ...]) calls, served by a zygote forked now (the module's docstring); env0:
    the run's environment (a rank's differing from it where it acts at import time starts cold)."""
    import ctypes

    if ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return  # not Linux: the ranks start cold
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # a message a request, fds beside it
    if os.fork() == 0:
        ours.close()
        _zygote(theirs)
    theirs.close()
    real = subprocess.Popen._execute_child

    # CPython's POSIX signature (3.11-3.13); rest: startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
    # c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask, start_new_session, process_group
    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest):
        argv = [os.fsdecode(a) for a in args] if isinstance(args, list | tuple) else []
        if (len(argv) < 2 or argv[0] != sys.executable or not argv[1].endswith(".py") or env is None
                or executable is not None or preexec_fn is not None or pass_fds or len(rest) < 16 or rest[2]
                or any(x not in (None, -1) for x in rest[10:14]) or not warm_enough(dict(env), env0)):
            return real(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest)
        p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite = rest[3:9]
        streams = [(fd, target) for fd, target in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2)) if fd != -1]
        req = {"argv": argv[1:], "cwd": os.fsdecode(cwd) if cwd else os.getcwd(), "env": dict(env),
               "fds": [t for _, t in streams], "session": bool(rest[14]), "group": rest[15]}
        try:
            socket.send_fds(ours, [json.dumps(req).encode()], [fd for fd, _ in streams])
            self.pid = int(ours.recv(64))
            self._child_created = True
        finally:  # the child's ends of the pipes, closed in the parent as CPython's _execute_child does
            devnull = getattr(self, "_devnull", None)
            for child, parent in ((p2cread, p2cwrite), (c2pwrite, c2pread), (errwrite, errread)):
                if child != -1 and parent != -1 and child != devnull:
                    os.close(child)
            if devnull is not None:
                os.close(devnull)
            self._closed_child_pipe_fds = True

    subprocess.Popen._execute_child = _execute_child


def main(fd: int) -> None:
    import diffusers.models.transformers.transformer_flux  # noqa: F401
    import jsonargparse  # noqa: F401
    import lightning  # noqa: F401
    import psutil  # noqa: F401
    import rich.console  # noqa: F401
    import torch  # noqa: F401
    import wandb  # noqa: F401

    import callbacks  # noqa: F401
    import flux_cp.checks  # noqa: F401
    import flux_cp.train.bare  # noqa: F401
    import flux_cp.train.module  # noqa: F401

    sock = socket.socket(fileno=fd)
    reader = sock.makefile("r")
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for line in reader:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the run
            sock.close()
            os.setpgid(0, 0)  # its own group: a timed-out run is killed with every rank it started
            for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(f, fd)
                os.close(f)
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            _serve_ranks_warm(req["env"])
            run_script(req["argv"], req["cwd"], req["env"])
        sock.sendall((json.dumps({"pid": pid}) + "\n").encode())
        _, status = os.waitpid(pid, 0)
        sock.sendall((json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n").encode())


if __name__ == "__main__":
    main(int(sys.argv[1]))
