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

if __name__ == "__main__":
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    for sq, skv in ((4608, 4608), (2304, 4608), (576, 4608)):
        for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
            r = subprocess.run([sys.executable, "-c", CASE.format(sq=sq, skv=skv, backend=backend)],
                               capture_output=True, text=True, env=env, timeout=120)
            last = (r.stdout.strip() or r.stderr.strip() or "?").splitlines()[-1]
            err = [ln for ln in r.stderr.splitlines() if "Error" in ln][:1]
            verdict = "ok, " + last if r.returncode == 0 else "FAILS: " + (err or [last])[0]
            print(f"S_q {sq:5d} S_kv {skv:5d} {backend:16s}: {verdict}")
