"""The planner's memory estimate against the tiny model's live-tensor peaks on the CPU (docs/results/2026-12-07j).

    python docs/results/2026-12-07j-cpu-memory-live/memory_live.py      # from the repository root, ~1-2 min on 2 cores

Each case is train_bench.py's bare loop in this process (configs/tiny.yaml, two warm-up steps counted, one measured);
the CPU's activation units are fitted from one sample against two at W = 1 per mode (as tests/test_memory_estimate.py
does), then every case's estimate is printed with the H100's units and with the CPU's.
"""

import contextlib
import importlib.util
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from flux_cp.plan.plans import H100_UNITS, fit_units, run_memory_gib  # noqa: E402

spec = importlib.util.spec_from_file_location("train_bench", ROOT / "scripts" / "train_bench.py")
train_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_bench)
OUT = Path(tempfile.mkdtemp(prefix="memory_live-"))
FOUR = ["--simulate-world", "4"]
CASES = {
    "W=1": [], "W=1 B=4": ["--data.batch_size", "4"],
    "W=1 selective B=4": ["--checkpointing", "selective", "--data.batch_size", "4"],
    "W=1 full B=4": ["--checkpointing", "full", "--data.batch_size", "4"],
    "DDP x4": [*FOUR, "--cp-degree", "1", "--data.global_batch", "4"],
    "ZeRO-2 x4": [*FOUR, "--weights", "zero2", "--cp-degree", "1", "--data.global_batch", "4"],
    "FSDP x4": [*FOUR, "--weights", "fsdp", "--cp-degree", "1", "--data.global_batch", "4"],
    "FSDP x4 B=32": [*FOUR, "--weights", "fsdp", "--cp-degree", "1", "--data.global_batch", "32"],
    "FSDP x4 selective B=8": [*FOUR, "--weights", "fsdp", "--cp-degree", "1", "--data.global_batch", "8",
                              "--checkpointing", "selective"],
    "FSDP x4 blocks kept": [*FOUR, "--weights", "fsdp", "--cp-degree", "1", "--data.global_batch", "4",
                            "--fsdp-reshard-last", "4"],
    "Ulysses x4 DDP": [*FOUR, "--cp", "ulysses"],
    "Ulysses x4 ZeRO-2": [*FOUR, "--cp", "ulysses", "--weights", "zero2"],
    "Ulysses x4 FSDP": [*FOUR, "--cp", "ulysses", "--weights", "fsdp"],
    "allgather-kv x4": [*FOUR, "--cp", "allgather-kv"],
    "dp2 x Ulysses2 ZeRO-2": [*FOUR, "--cp", "ulysses", "--cp-degree", "2", "--data.global_batch", "2",
                              "--weights", "zero2"],
    "TP x2": ["--simulate-world", "2", "--cp", "tp"],
    "TP x2 B=4": ["--simulate-world", "2", "--cp", "tp", "--data.batch_size", "4"],
    "TP x4 full": [*FOUR, "--cp", "tp", "--checkpointing", "full"],
    "LoRA W=1 B=4": ["--lora-rank", "8", "--data.batch_size", "4"],
    "LoRA Ulysses x4": ["--lora-rank", "8", *FOUR, "--cp", "ulysses"],
    "LoRA FSDP x4 B=8": ["--lora-rank", "8", *FOUR, "--weights", "fsdp", "--cp-degree", "1", "--data.global_batch",
                         "8"],
}


def run(n: int, args: list[str]) -> dict:
    out = OUT / f"run{n}"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = train_bench.main(["--config", str(ROOT / "configs" / "tiny.yaml"), "--harness", "bare", "--steps", "1",
                               "--warmup-steps", "2", "--wandb-mode", "disabled", "--output", str(out), *args])
    assert rc == 0, err.getvalue()[-2000:]
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    n = iter(range(10_000))
    modes = {"none": [], "selective": ["--checkpointing", "selective"], "full": ["--checkpointing", "full"],
             "lora_none": ["--lora-rank", "8"]}
    cpu = fit_units({mode: (run(next(n), args), run(next(n), [*args, "--data.batch_size", "2"]))
                     for mode, args in modes.items()})
    fit = {k: getattr(cpu, k) for k in modes}
    print("CPU units (a token, a block, x hidden x 4 bytes):", {k: round(v, 2) for k, v in fit.items()},
          "| H100's:", {k: v for k, v in vars(H100_UNITS).items() if k in ("none", "selective", "full", "lora_none")})
    print(f"{'case':24s} {'live KiB':>9s} {'est. H100 units':>16s} {'est. CPU units':>15s}")
    for name, args in CASES.items():
        d = run(next(n), args)
        m = d["memory"]["allocated_gib"]
        print(f"{name:24s} {m * 2**20:9.0f} {run_memory_gib(d) / m - 1:+16.1%} {run_memory_gib(d, cpu) / m - 1:+15.1%}")


if __name__ == "__main__":
    main()
