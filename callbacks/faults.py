"""FaultInjectionCallback: a test-only hook that makes one rank fail at one step, through the real
launcher and process group (tests/test_faults.py). train_bench adds it only when the variable is set:

    FLUX_CP_FAULT="rank=1,step=3,kind=raise"    # raise | hang | oom | kill | sleep (sleep: seconds=S, then go on)
"""

import os
import signal
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

ENV = "FLUX_CP_FAULT"
KINDS = ("raise", "hang", "oom", "kill", "sleep")
SLEEPING = "fault-sleeping"  # file in the run's output folder, made when kind=sleep starts sleeping


class InjectedFault(RuntimeError):
    """What kind=raise raises: an ordinary error in the middle of a training step."""


def parse_fault(spec: str) -> dict:
    """'rank=1,step=3,kind=raise' -> {'rank': 1, 'step': 3, 'kind': 'raise', 'seconds': 0.0}."""
    kv = dict(item.split("=", 1) for item in spec.split(",") if item.strip())
    fault = {"rank": int(kv.get("rank", 0)), "step": int(kv.get("step", 0)), "kind": kv.get("kind", "raise")}
    fault["seconds"] = float(kv.get("seconds", 0))
    if fault["kind"] not in KINDS:
        raise ValueError(f"{ENV}={spec!r}: kind must be one of {KINDS}")
    return fault


class FaultInjectionCallback(Callback):
    def __init__(self, spec: str):
        self.fault = parse_fault(spec)

    @classmethod
    def from_env(cls) -> "FaultInjectionCallback | None":
        spec = os.environ.get(ENV)
        return cls(spec) if spec else None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        f = self.fault
        if trainer.global_rank != f["rank"] or batch_idx != f["step"]:
            return
        if f["kind"] == "raise":
            raise InjectedFault(f"injected fault on rank {f['rank']} at step {f['step']}")
        if f["kind"] == "oom":  # a real allocation far beyond any memory: the allocator raises
            torch.empty(1 << 50, dtype=torch.uint8, device=pl_module.device)  # 1 PiB
        if f["kind"] == "kill":  # as the OOM killer would: no exception, no error file, the process just ends
            os.kill(os.getpid(), signal.SIGKILL)
        if f["kind"] == "sleep":
            (Path(trainer.default_root_dir) / SLEEPING).touch()  # tells the test the rank is in the step now
            time.sleep(f["seconds"])
        while f["kind"] == "hang":  # the other ranks wait in the step's collectives
            time.sleep(1)
