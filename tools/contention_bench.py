"""How much does a collective's traffic slow a GEMM beside it? (GPU)

    python tools/contention_bench.py --output contention.json      # Flux's QKV GEMM beside 8, 16, 24, 32 CTAs

The bf16 GEMM of Flux's QKV projection at 4608 tokens ((4608, 3072) @ (3072, 9216)) timed alone, a loop of --reps
back to back between two CUDA events (median of --trials loops), then beside the kernel --contention puts on a
simulated rank (flux_cp/parallel/contention.py) on a side stream, started with the loop and lasting past it:
- paced: an all-gather's traffic, its bus bytes at the link's bus bandwidth (--busbw-gbps, default h200-nvlink4's
  all_gather), its CTAs resident throughout, as --contention sizes every collective;
- unpaced: the same CTAs copying as fast as they can (its rate measured alone first): the most memory traffic
  that many CTAs make, an upper bound.
Each row: the GEMM's slowdown, against the published 18.9% average / 40% max slowdown of compute overlapped with
NCCL (arXiv 2507.03114); and the paced kernel's achieved duration alone against the one asked (its pacing works).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

PUBLISHED = {"avg_pct": 18.9, "max_pct": 40.0, "source": "arXiv 2507.03114"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4608,3072,9216", help="M,K,N of the GEMM (M x K @ K x N)")
    p.add_argument("--ctas", default="8,16,24,32", help="CTAs of the traffic kernel, comma-separated")
    p.add_argument("--busbw-gbps", type=float, default=None, help="paced rate; default: h200-nvlink4's all_gather")
    p.add_argument("--reps", type=int, default=50, help="GEMMs per timed loop")
    p.add_argument("--trials", type=int, default=7, help="timed loops per case (median)")
    p.add_argument("--output", type=Path, default=None, help="JSON file of the results")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("contention_bench.py: no CUDA device is visible: it times GPU kernels (run it on the GPU machine)",
              file=sys.stderr)
        return 2
    from flux_cp.parallel.contention import LINK, launch, scratch, sized
    from flux_cp.predict.links import load

    M, K, N = (int(x) for x in a.shape.split(","))
    busbw = a.busbw_gbps or load(LINK).kinds["all_gather"].busbw_gbps
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def gemms() -> float:
        """One timed loop of a.reps GEMMs: ms per GEMM."""
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(a.reps):
            torch.mm(x, w, out=out)
        t1.record()
        torch.cuda.synchronize()
        return t0.elapsed_time(t1) / a.reps

    def alone(traffic, ctas, bufs) -> float:
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        launch(traffic, ctas, *bufs)
        t1.record()
        torch.cuda.synchronize()
        return t0.elapsed_time(t1)

    def beside(traffic, ctas, bufs) -> float:
        side.wait_stream(torch.cuda.current_stream())  # both start together
        with torch.cuda.stream(side):
            launch(traffic, ctas, *bufs)
        ms = gemms()
        torch.cuda.synchronize()
        return ms

    for _ in range(10):
        torch.mm(x, w, out=out)
    base = statistics.median(gemms() for _ in range(a.trials))
    loop_ms = base * a.reps
    span_ms = 2 * loop_ms + 1.0  # the traffic outlasts the loop even if the GEMMs slow down 2x
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": [M, K, N],
              "reps": a.reps, "trials": a.trials, "gemm_ms": base, "gemm_tflops": 2 * M * K * N / base / 1e9,
              "busbw_gbps": busbw, "published": PUBLISHED, "rows": []}
    print(f"{result['device']}: GEMM {M}x{K} @ {K}x{N} bf16 alone {base:.4f} ms ({result['gemm_tflops']:.0f} TFLOP/s)")
    for ctas in (int(c) for c in a.ctas.split(",")):
        bufs = scratch(torch.device("cuda"), ctas)
        launch(sized(4, 1000, ctas), ctas, *bufs)  # compiled before timing
        probe = sized(256 * 2**20, 0, ctas)  # its own rate, unpaced
        rate = 256 * 2**20 / statistics.median(alone(probe, ctas, bufs) for _ in range(3)) / 1e6  # GB/s
        cases = {"paced": sized(int(busbw * 1e9 * span_ms / 1e3), int(span_ms * 1e6), ctas),
                 "unpaced": sized(int(rate * 1e9 * span_ms / 1e3), 0, ctas)}
        for mode, traffic in cases.items():
            achieved = statistics.median(alone(traffic, ctas, bufs) for _ in range(3))
            ms = statistics.median(beside(traffic, ctas, bufs) for _ in range(a.trials))
            row = {"ctas": ctas, "mode": mode, "traffic_gbps": traffic.bus_bytes / span_ms / 1e6,
                   "requested_ms": span_ms, "achieved_alone_ms": achieved, "gemm_ms": ms,
                   "slowdown_pct": 100 * (ms / base - 1)}
            result["rows"].append(row)
            print(f"  {ctas:3d} CTAs {mode:8s} {row['traffic_gbps']:7.0f} GB/s (alone {achieved:.2f} ms for "
                  f"{span_ms:.2f} asked): GEMM {ms:.4f} ms, {row['slowdown_pct']:+.1f}%")
    print(f"published: {PUBLISHED['avg_pct']}% average, {PUBLISHED['max_pct']:.0f}% max slowdown of compute overlapped "
          f"with NCCL ({PUBLISHED['source']})")
    if a.output:
        a.output.parent.mkdir(parents=True, exist_ok=True)
        a.output.write_text(json.dumps(result, indent=1))
        print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
