"""Measure a link profile on this machine: latency and bus bandwidth per collective kind -> configs/links YAML.

    python tools/measure_links.py --world 2 --out configs/links/cpu-gloo.yaml            # gloo on CPU
    python tools/measure_links.py --world 8 --out configs/links/h200-measured.yaml       # NCCL on 8 GPUs

Spawns W processes (one per GPU with NCCL), times each collective at message sizes from --min-bytes to
--max-bytes (nccl-tests' "size": all_gather = output, reduce_scatter = input, all_to_all = send buffer),
takes per size the median over iterations of the slowest rank, and fits time = latency + size x
bus factor / busbw (links.fit). The YAML holds the fit, the raw times and the NCCL_* environment (NVLink
SHARP is off on the lent machines: NCCL_NVLS_ENABLE=0 reproduces that elsewhere). Timer: CUDA events on
GPU, perf_counter on CPU (synchronous collectives there).
"""

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send")


def _sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def _op(kind: str, size: int, world: int, rank: int, device):
    """A closure running one collective of nccl-tests size `size` bytes (fp32 elements, rounded to W)."""
    import torch
    import torch.distributed as dist

    n = max(world, size // 4 // world * world)  # elements, a multiple of W
    x = torch.ones(n, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(x)
    if kind == "all_gather":  # size = output
        inp = torch.ones(n // world, device=device)
        return lambda: (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(x, inp)
    if kind == "reduce_scatter":  # size = input
        out = torch.empty(n // world, device=device)
        return lambda: (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, x)
    if kind == "all_to_all":
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x)
    if kind == "broadcast":
        return lambda: dist.broadcast(x, src=0)
    if kind == "send":  # a ring step: each rank sends to the next and receives from the previous, at once
        buf = torch.empty_like(x)

        def ring():
            ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, buf, (rank - 1) % world)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return ring
    raise ValueError(kind)


def _time_ms(fn, iters: int, device) -> list[float]:
    import torch

    out = []
    for _ in range(iters):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


def worker(rank: int, args, port: int, result_path: str):
    import torch
    import torch.distributed as dist

    from flux_cp.predict import links

    cuda = args.backend == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.world)
    sizes = _sizes(args.min_bytes, args.max_bytes, args.factor)
    kinds, raw, skipped = {}, {}, {}
    try:
        for kind in args.kinds:
            times = []
            try:
                for size in sizes:
                    fn = _op(kind, size, args.world, rank, device)
                    for _ in range(args.warmup):
                        fn()
                    dist.barrier()
                    med = statistics.median(_time_ms(fn, args.iters, device))
                    t = torch.tensor([med], dtype=torch.float64, device=device)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the collective's time
                    times.append(float(t.item()))
                    del fn
            except RuntimeError as e:  # a kind this backend lacks: listed, the others still measured
                skipped[kind] = str(e).strip().splitlines()[0][:200]
                continue
            lat, bw = links.fit(sizes, times, kind, args.world)
            kinds[kind] = links.KindLink(round(lat, 2), round(bw, 4),
                                         f"measured: tools/measure_links.py, {args.backend}, {args.world} ranks, "
                                         f"{len(sizes)} sizes {sizes[0]}-{sizes[-1]} B, fit of median times")
            raw[kind] = [round(t, 5) for t in times]
        if rank == 0:
            import platform

            env = {"device": torch.cuda.get_device_name(device) if cuda else f"cpu ({platform.machine()}, "
                   f"{os.cpu_count()} cores)", "hostname": socket.gethostname(), "torch": str(torch.__version__)}
            prof = links.LinkProfile(args.name, kinds, f"measured on {env['device']} ({env['hostname']})", True,
                                     {"backend": args.backend, "world": args.world, "device": env["device"],
                                      "torch": env["torch"], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "command": " ".join(["python", "tools/measure_links.py", *sys.argv[1:]]),
                                      "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
                                      "sizes_bytes": sizes, "times_ms": raw, "unsupported": skipped})
            links.save(prof, Path(result_path))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="measure_links.py", description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="processes (one per GPU with NCCL)")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {KINDS}")
    p.add_argument("--min-bytes", type=int, default=1024)
    p.add_argument("--max-bytes", type=int, default=2**30)
    p.add_argument("--factor", type=int, default=4, help="size step between messages")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--name", default=None, help="profile name (default: the output file's stem)")
    p.add_argument("--out", type=Path, required=True, help="YAML to write")
    args = p.parse_args(argv)
    import torch
    import torch.multiprocessing as mp

    if args.backend == "auto":
        args.backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= args.world else "gloo"
    if args.backend == "nccl" and torch.cuda.device_count() < args.world:
        p.error(f"--world {args.world} needs as many GPUs with nccl; {torch.cuda.device_count()} here")
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if bad := [k for k in args.kinds if k not in KINDS]:
        p.error(f"--kinds: unknown {bad}; choose from {KINDS}")
    if args.world < 2 or args.min_bytes < 4 or args.max_bytes < args.min_bytes or args.factor < 2:
        p.error("need --world >= 2, 4 <= --min-bytes <= --max-bytes, --factor >= 2")
    args.name = args.name or args.out.stem
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if args.backend == "gloo":  # loopback: the ranks are local, whatever interfaces the machine has
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(worker, args=(args, port, str(args.out)), nprocs=args.world, join=True)
    print(f"measure_links.py: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
