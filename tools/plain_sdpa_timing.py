"""A plain torch timing of one SDPA call, forward and backward: the yardstick for --ops-only's figures.

    python tools/plain_sdpa_timing.py --seq-len 4608    # -> one JSON line: per-call medians in ms

No project code: bf16 inputs that require grad (as in training), 20 warm-up calls (at most --reps), then
`--reps` calls, each between two CUDA events, synchronising once at the end; median over calls.
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--seq-len", type=int, default=4608)
p.add_argument("--batch", type=int, default=1)
p.add_argument("--heads", type=int, default=24)
p.add_argument("--head-dim", type=int, default=128)
p.add_argument("--reps", type=int, default=100)
a = p.parse_args()

q, k, v = (torch.randn(a.batch, a.heads, a.seq_len, a.head_dim, device="cuda", dtype=torch.bfloat16,
                       requires_grad=True) for _ in range(3))  # fmt: skip
out = F.scaled_dot_product_attention(q, k, v)
dout = torch.randn_like(out)
calls = {
    "sdpa_fwd_ms": lambda: F.scaled_dot_product_attention(q, k, v),
    "sdpa_bwd_ms": lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
}
result = {"seq_len": a.seq_len, "device": torch.cuda.get_device_name(), "torch": torch.__version__}
for name, call in calls.items():
    for _ in range(min(20, a.reps)):
        call()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.reps)]
    for start, end in events:
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    result[name] = statistics.median(s.elapsed_time(e) for s, e in events)
print(json.dumps(result))
