"""Does cuDNN SDPA (forward + backward) work when queries are shorter than keys? One case per process
(an illegal memory access poisons the CUDA context), CUDA_LAUNCH_BLOCKING=1 so the fault is named.

    python tools/check_cudnn_qkv.py        # prints one line per (S_q, S_kv, backend)
"""

import os
import subprocess
import sys

CASE = """
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
sq, skv, backend = {sq}, {skv}, SDPBackend.{backend}
q = torch.randn(1, 24, sq, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k, v = (torch.randn(1, 24, skv, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
with sdpa_kernel([backend]):
    out = F.scaled_dot_product_attention(q, k, v)
    out.backward(torch.randn_like(out))
torch.cuda.synchronize()
ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
print(f"max |out - fp32| = {{(out.float() - ref).abs().max().item():.3g}}")
"""

def run_case(code: str, timeout: int = 120) -> tuple[bool, str]:
    """One CUDA case in its own process (a fault poisons the CUDA context), CUDA_LAUNCH_BLOCKING=1 so a fault is named,
    flux_cp importable: (ran, its last line of output, or the fault's first error line)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    last = (r.stdout.strip() or r.stderr.strip() or "?").splitlines()[-1]
    err = [ln for ln in r.stderr.splitlines() if "Error" in ln][:1]
    return r.returncode == 0, last if r.returncode == 0 else (err or [last])[0]


if __name__ == "__main__":
    for sq, skv in ((4608, 4608), (2304, 4608), (576, 4608)):
        for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
            ok, line = run_case(CASE.format(sq=sq, skv=skv, backend=backend))
            print(f"S_q {sq:5d} S_kv {skv:5d} {backend:16s}: {'ok, ' if ok else 'FAILS: '}{line}")
