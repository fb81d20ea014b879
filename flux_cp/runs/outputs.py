"""Run folders: a fresh folder per run by default, and no run ever writes into another's.

    runs/<run_name>/<UTC time>/      default: one per run (torchtitan's timestamped dumps); `runs/<run_name>/latest`
                                     points at the newest. Launched by torchrun / SLURM: the job id instead of the time.
    --output DIR                     as given; refused (exit 2, before any rank starts) while another live run holds
                                     its lock, when it holds a run, complete or not (unless --overwrite), or
                                     when it cannot be written.

The launcher process claims the folder (lock file with its pid), before Lightning starts the other ranks, which
find the folder in FLUX_CP_RUN_DIR; the lock goes at exit, and one whose pid is gone is taken over. A run that
reuses a folder (a sweep's resume, --overwrite) first removes the previous run's record there (summary.json,
error files, wandb runs), so that nothing of it is merged into the new one and wandb runs do not pile up.
"""

import atexit
import contextlib
import json
import os
import shutil
import time
from pathlib import Path

from flux_cp.config import ConfigError

LOCK = "run.lock"
RUN_DIR_ENV = "FLUX_CP_RUN_DIR"  # the launcher's chosen folder, inherited by the ranks it starts
PREVIOUS = ("summary.json", "error-rank*.json", ".summary.json.*.tmp", ".error-rank*.tmp", ".heartbeat-rank*", "wandb",
            "traces")


def default_output(root: Path, name: str, env=os.environ) -> Path:
    """A new folder under root/name: the launch's job id, else the UTC time (plus -N if taken)."""
    job = env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID")  # every node must pick the same folder
    if job and job != "none":
        return root / name / f"job-{job}"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for i in range(1000):
        path = root / name / (stamp if i == 0 else f"{stamp}-{i}")
        if not path.exists():
            return path
    raise ConfigError(f"{root / name}: no free run folder for {stamp} (use --output)")


def _owner(lock: Path) -> dict | None:
    """The lock's owner if that process still runs (same pid and start time), else None (stale or no lock)."""
    import psutil

    try:
        owner = json.loads(lock.read_text())
        p = psutil.Process(owner["pid"])
        if p.status() != psutil.STATUS_ZOMBIE and abs(p.create_time() - owner["started"]) < 1.0:
            return owner
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        pass
    return None


def claim(output: str | None, name: str, overwrite: bool) -> Path:
    """The run's folder, created, locked by this process, cleared of a previous run's record; a one-line
    ConfigError if it cannot be used."""
    import psutil

    if output is None:
        out = default_output(Path("runs"), name)
    else:
        out = Path(output)
    flag = f"--output {out}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{flag}: a file is in the way (pick a folder)") from None
    except OSError as e:
        raise ConfigError(f"{flag}: cannot create the folder ({e.strerror or e})") from None
    lock = out / LOCK
    if owner := _owner(lock):
        raise ConfigError(f"{flag}: a live run (pid {owner['pid']}, since {owner['since']}) writes there: wait for it, "
                          "or pick another --output")
    summary = out / "summary.json"
    if not overwrite and (held := _held(summary)):  # an interrupted or failed run's record is kept as well
        raise ConfigError(f"{flag}: holds {held} (its summary.json); add --overwrite to replace it, or leave "
                          "--output out for a new folder")
    me = psutil.Process()
    record = {"pid": me.pid, "started": me.create_time(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = out / f".{LOCK}.{me.pid}"
    try:
        tmp.write_text(json.dumps(record))
        os.replace(tmp, lock)  # a stale lock is taken over
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise ConfigError(f"{flag}: cannot be written ({e.strerror or e})") from None
    atexit.register(release, lock, me.pid)
    for pattern in PREVIOUS:
        for f in out.glob(pattern):
            shutil.rmtree(f, ignore_errors=True) if f.is_dir() else f.unlink(missing_ok=True)
    if output is None:
        _point_latest(out)
    os.environ[RUN_DIR_ENV] = str(out)  # the ranks Lightning starts run this script again: same folder
    return out


def _held(summary: Path) -> str | None:
    """What the folder's summary.json records: "a complete run", "an incomplete run (interrupted)", or None."""
    try:
        d = json.loads(summary.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "an unreadable run record"
    if not isinstance(d, dict):
        return "an unreadable run record"
    return "a complete run" if d.get("complete") else f"an incomplete run ({d.get('error_kind') or 'unfinished'})"


def _point_latest(out: Path) -> None:
    """runs/<run_name>/latest -> the newest run folder (replaced atomically; a no-op where links are not allowed)."""
    link = out.parent / "latest"
    tmp = out.parent / f".latest.{os.getpid()}"
    try:
        tmp.symlink_to(out.name, target_is_directory=True)
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)


def release(lock: Path, pid: int) -> None:
    owner = _owner(lock)
    if owner is not None and owner["pid"] == pid:
        lock.unlink(missing_ok=True)


def release_claim(out: Path) -> None:
    """This process's lock on out, released now (a run stopped by a signal exits without its atexit hooks)."""
    release(out / LOCK, os.getpid())


def run_dir(output: str | None, name: str, overwrite: bool, claimer: bool) -> str:
    """The launcher (global rank 0's process) claims the folder; the ranks Lightning starts take the one it chose,
    the ranks an outside launcher started (torchrun, SLURM) the same one by the job id."""
    if claimer:
        return str(claim(output, name, overwrite))
    return output or os.environ.get(RUN_DIR_ENV) or str(default_output(Path("runs"), name))


WANDB_INIT_TIMEOUT_S = 20.0  # wandb's own default is 90 s, and it retries: ~2 minutes of a run blocked without network


def wandb_settings():
    """Quiet, bounded wandb: no git probing (its "git root" warning), a short start-up timeout."""
    import wandb

    timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", WANDB_INIT_TIMEOUT_S))
    return wandb.Settings(init_timeout=timeout, disable_git=True)
