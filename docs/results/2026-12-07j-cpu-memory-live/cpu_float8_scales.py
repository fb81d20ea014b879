"""Addendum (next session): why a CPU's float8 GEMM gets its tensor-wise scales broadcast
(flux_cp/train/fp8.cpu_scales), and what the start of a run pays to forget an earlier in-process run's group
(flux_cp/runs/process_state.py).

    python docs/results/2026-12-07j-cpu-memory-live/cpu_float8_scales.py
"""

import platform
import subprocess
import sys
import time

import torch

from flux_cp.train.fp8 import E4M3, cpu_scales, to_float8


def best_ms(a8, b8, a_inv, b_inv, repeats=3) -> float:
    """The fastest of `repeats` calls of torch._scaled_mm, in ms."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        torch._scaled_mm(a8, b8, scale_a=a_inv, scale_b=b_inv, out_dtype=torch.bfloat16)
        times.append((time.perf_counter() - t) * 1e3)
    return min(times)


cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
print(f"torch {torch.__version__}, python {platform.python_version()}, {cpu}, {torch.get_num_threads()} threads, "
      f"amx_tile={'amx_tile' in flags} avx512_fp16={'avx512_fp16' in flags}")
torch.manual_seed(0)
for m, k, n in ((144, 256, 768), (288, 256, 1024)):  # the tiny model's token linears, one and two samples
    x8, xs = to_float8(torch.randn(m, k, dtype=torch.bfloat16), E4M3, False)
    w8, ws = to_float8(torch.randn(n, k, dtype=torch.bfloat16), E4M3, False)
    single = best_ms(x8, w8.t(), xs, ws)
    a, b = cpu_scales(x8, w8.t(), xs, ws)
    broadcast = best_ms(x8, w8.t(), a, b)
    y = torch._scaled_mm(x8, w8.t(), scale_a=a, scale_b=b, out_dtype=torch.bfloat16).float()
    ref = (x8.float() * xs) @ (w8.float() * ws).t()
    print(f"{m} x {k} x {n}: single scale {single:.1f} ms, broadcast {broadcast:.2f} ms ({single / broadcast:.0f}x); "
          f"broadcast's largest error against the fp32 product {(y - ref).abs().max():.3f} at |y| <= "
          f"{ref.abs().max():.1f}")

code = ("import time, torch.distributed; from flux_cp.runs.process_state import forget_process_groups; "
        "t = time.perf_counter(); forget_process_groups(); print(f'{(time.perf_counter() - t) * 1e3:.3f}')")
ms = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
print(f"forget_process_groups() in a fresh process (no DTensor imported): {ms} ms")
