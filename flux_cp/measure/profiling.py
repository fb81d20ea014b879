"""Kernel breakdown of profiled training steps, from a torch.profiler Chrome trace.

The trace (one per rank) is the evidence; this module reduces it to per-step figures:

    attention        SDPA kernels (flash / cuDNN / memory-efficient), forward and backward
    gemm             matmul kernels (cuBLAS / cuBLASLt nvjet / CUTLASS), outside attention
    comm_attention   NCCL kernels of the CP strategy's K/V exchange (all-gather, reduce-scatter, send/recv)
    comm_grad        NCCL all-reduce: the gradient synchronisation of the replicated weights
    optimizer        the optimizer step's kernels (AdamW): a fixed cost per step, whatever W
    other            everything else on the device (elementwise, norms, copies)
    busy             union of all device intervals (overlapping streams count once)
    idle             device window of the step minus busy: the host-bound gaps
    step             device window: first kernel start to last kernel end of the step

On a CPU run there are no kernels: the leaf compute ops (aten GEMMs, the SDPA kernel ops) and the
c10d collectives stand in for them, the step is its own range, and the CPU is never idle.

Kernels belong to a step by their launch: the CPU-side launch (matched by correlation id) falls
inside the step's `flux_cp::step<i>` range. They belong to a timing region the same way, through
the `flux_cp::<region>_fwd|bwd` ranges that StepTimer opens while profiling, so the per-call kernel
time of each region can be set beside the callback's CUDA-event figure for the same steps.
"""

import bisect
import gzip
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

_ATTN = re.compile(r"flash|fmha|attention|sdpa|_attn|fprop|bprop", re.I)
_ATTN_BWD = re.compile(r"bwd|backward|bprop|cutlassB|dot_do_o|convert_dq", re.I)
_OPT = re.compile(r"adam|multi_tensor_apply", re.I)
_GEMM = re.compile(r"gemm|nvjet|xmma|cutlass|cublas|matmul|splitk|^aten::(mm|addmm|bmm|baddbmm)$", re.I)
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_CPU_LEAF = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|_scaled_dot_product_\w+)$|^c10d::|^gloo:")
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
REGIONS = ("sdpa_fwd", "sdpa_bwd", "qkv_gemm_fwd", "qkv_gemm_bwd")
TOP = 8  # the heaviest kernels kept per class: what a class's time is made of, by name
NAME_CHARS = 120  # inductor's fused-kernel names run to hundreds of characters


def kernel_class(name: str) -> str:
    low = name.lower()
    if "nccl" in low or low.startswith(("c10d::", "gloo:")):
        return "comm_grad" if "allreduce" in low else "comm_attention"
    if _OPT.search(name):
        return "optimizer"
    if _ATTN.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    return "other"


def load_trace(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def breakdown(events: list[dict]) -> dict:
    """Per profiled step: category times, busy, idle, step (ms); per region: kernel ms per call; per class, its
    heaviest kernels by name (ms a step, averaged over the profiled steps)."""
    cuda = any(e.get("cat") == "kernel" for e in events)
    launches = {}  # correlation id -> launch time on the CPU (us)
    ranges = []  # (start, end, name) of our record_function ranges
    work = []  # (launch time, start, duration, class, name) of every kernel (or CPU leaf op)
    for e in events:
        cat, args = e.get("cat"), e.get("args") or {}
        if not cuda and cat == "cpu_op" and _CPU_LEAF.search(e.get("name", "")):
            work.append((e["ts"], e["ts"], e.get("dur", 0), kernel_class(e["name"]), e["name"]))
        elif cat in _LAUNCH_CATS and "correlation" in args:
            launches[args["correlation"]] = e["ts"]
        elif cat == "user_annotation" and e.get("name", "").startswith("flux_cp::"):
            ranges.append((e["ts"], e["ts"] + e.get("dur", 0), e["name"][len("flux_cp::") :]))
    steps = sorted((a, b, n) for a, b, n in ranges if n.startswith("step"))
    regions = sorted((a, b, n) for a, b, n in ranges if not n.startswith("step"))
    region_starts = [a for a, _, _ in regions]

    per_step = defaultdict(lambda: defaultdict(float))
    spans = defaultdict(list)
    region_ms = defaultdict(float)  # region name -> kernel ms summed over profiled steps
    for e in events:
        if e.get("cat") in _DEVICE_CATS:
            t = launches.get((e.get("args") or {}).get("correlation"))
            if t is not None:
                work.append((t, e["ts"], e.get("dur", 0), kernel_class(e["name"]) if e["cat"] == "kernel" else "other",
                             e["name"]))
    by_name = defaultdict(float)  # (class, kernel name) -> ms over the profiled steps
    for t, a, dur, cls, name in work:
        step = next((n for sa, sb, n in steps if sa <= t <= sb), None)
        if step is None:
            continue
        per_step[step][cls] += dur / 1e3
        by_name[cls, name[:NAME_CHARS]] += dur / 1e3
        spans[step].append((a, a + dur))
        i = bisect.bisect_right(region_starts, t) - 1  # regions do not overlap: the last one starting before t
        if i >= 0 and t <= regions[i][1]:
            region_ms[regions[i][2]] += dur / 1e3
    if not per_step:
        return {}
    rows = []
    for step, cats in per_step.items():
        if cuda:
            busy = _union(spans[step]) / 1e3
            window = (max(b for _, b in spans[step]) - min(a for a, _ in spans[step])) / 1e3
        else:  # the CPU runs everything itself: the step is its range, all of it busy
            busy = window = next(b - a for a, b, n in steps if n == step) / 1e3
            cats["other"] = window - sum(cats.values())
        rows.append({**cats, "busy": busy, "step": window, "idle": window - busy})
    keys = ("attention", "gemm", "comm_attention", "comm_grad", "optimizer", "other", "busy", "idle", "step")
    med = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}
    calls = defaultdict(int)
    for _, _, n in regions:
        calls[n] += 1
    ops = {n: region_ms[n] / calls[n] for n in REGIONS if calls[n]}
    top = defaultdict(list)
    for (cls, name), ms in sorted(by_name.items(), key=lambda kv: -kv[1]):
        if len(top[cls]) < TOP:
            top[cls].append([name, ms / len(rows)])
    return {
        "device": "cuda" if cuda else "cpu",
        "steps": len(rows),
        "breakdown_ms": med,
        "idle_frac": med["idle"] / med["step"] if med["step"] else 0.0,
        "ops_call_ms": ops,
        "top_kernels_ms": dict(top),
    }
