"""Op-only microbenchmark (`train_bench.py --ops-only`): SDPA forward/backward and the Flux QKV GEMM
forward/backward, per call, at the per-rank shapes of a W-way context-parallel split.

What each rank computes per call (B batch, H heads, S total tokens, D head_dim, h = H * D hidden):
    sdpa:      q, k, v (B, H, S/W, D) through strategy.attention (its collectives included)
    qkv_gemm:  (B * S/W, h) x (h, 3h) + bias, as diffusers' fused to_qkv; bwd = dX and dW GEMMs
With --simulate-world W[,W...] one process is rank 0 of each W-rank job in turn, over torch's fake process group
(flux_cp/parallel/fake_group.py): the real strategy runs (torch's ring with its W chunks and merges, Ulysses' all-to-all
layouts, allgather-kv's gather), its collectives moving nothing: rows say `simulated: true`.

Timing ("corrected"): warm-up, then up to `reps` calls, each between two CUDA events (device time) and
two perf_counter readings (host time to issue it). Each batch of calls is queued behind a spin kernel
(torch.cuda._sleep) long enough for the host to enqueue the whole batch, so the events time the op's
kernels back to back, not the host's pace. Inputs rotate over enough buffers to overflow L2. With
--graph, each buffer's call is also captured in a CUDA graph and replayed (no launch overhead).
On CPU, calls run synchronously: one perf_counter pair gives the time (device = host).

"seed-compat" (--seed-compat) reproduces ../shared/seed: its GEMM shape (K = head_dim), one buffer,
warm-up, then one event, N back-to-back calls, barrier, event: per call = elapsed / N, which is the
host's pace whenever issuing a call takes longer than running it.
"""

import contextlib
import math
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from flux_cp.config import BenchConfig, run_name
from flux_cp.data import DTYPES
from flux_cp.measure.timing import hold_stream
from flux_cp.parallel.cp import CPStrategy
from flux_cp.parallel.registry import make_strategy
from flux_cp.runs.outputs import wandb_settings
from flux_cp.runs.results import env_info, stats, write_json_atomic

OPS = ("sdpa_fwd", "sdpa_bwd", "qkv_gemm_fwd", "qkv_gemm_bwd")
BUDGET_MS = 1000.0  # GPU: timed calls per op stop near this much device time ...
MIN_REPS = 3  # ... but never fewer than this (a 100k-token SDPA backward is ~0.6 s)
CPU_REPS = 5
BATCH = 10  # calls queued behind one spin kernel (well inside CUDA's launch queue)
PEAK_N = 8192  # the bf16 GEMM peak: one PEAK_N^3 GEMM
SEED_WARMUP, SEED_RUNS = 10, 20  # the seed script's counts
GRAPH_MAX_MS = 20.0  # --graph: ops longer than this per call are not captured (nothing to strip)


@dataclass
class Op:
    """One measurement. `build()` runs inside `context()` and returns one zero-argument call per buffer."""

    name: str
    shape: str
    flops: float
    build: Callable[[], list[Callable]]
    context: Callable = contextlib.nullcontext
    graph: bool | str = True  # True, or why this op cannot be captured


# ---------------------------------------------------------------- the ops


class OpFactory:
    """Builds the ops of one (seq len, W) case on this rank."""

    def __init__(self, cfg: BenchConfig, strategy: CPStrategy, device: torch.device, cuda: bool):
        self.cfg, self.strategy, self.device, self.cuda = cfg, strategy, device, cuda
        self.dtype = DTYPES[cfg.run.precision]
        props = torch.cuda.get_device_properties(device) if cuda else None
        self.l2_bytes = getattr(props, "L2_cache_size", 50 << 20)  # 50 MiB: H100/H200

    def _rand(self, shape, grad=False):
        return torch.randn(shape, device=self.device, dtype=self.dtype, requires_grad=grad)

    def nbuf(self, *shapes) -> int:
        """Input sets to rotate over so that together they are >= 3x L2 (2 at least; 2 on CPU)."""
        if not self.cuda:
            return 2
        size = sum(math.prod(s) for s in shapes) * torch.finfo(self.dtype).bits // 8
        return max(2, min(8, math.ceil(3 * self.l2_bytes / size)))

    def sdpa(self, seq_len: int, world: int, seed: bool = False) -> list[Op]:
        m, cp = self.cfg.model, self.cfg.run.cp
        b, h, d, s = self.cfg.data.batch_size, m.num_heads, m.head_dim, seq_len
        q_shape = kv_shape = (b, h, s // world, d)  # local tokens in, the strategy's collectives inside
        attend, ctx = self.strategy.attention, self.strategy.step_context

        def run(q, k, v):  # -> list of outputs, (B, H, S/W, D) each
            return [attend(q, k, v)]

        # every split computes S/W queries x S keys per rank: QK^T and PV, 2 * 2 * ... flops
        flops = 4 * b * h * (s // world) * s * d
        shape = f"q,k,v{_fmt(q_shape)} local"
        n = 1 if seed else self.nbuf(q_shape, kv_shape, kv_shape)
        graph = True
        if world > 1 or cp == "torch":
            graph = f"sdpa under --cp {cp} (W={world}) dispatches through collectives/DTensor: not captured"

        def build_fwd():
            sets = [[self._rand(q_shape, not seed), self._rand(kv_shape, not seed), self._rand(kv_shape, not seed)]
                    for _ in range(n)]
            return [partial(run, *x) for x in sets]

        def build_bwd():
            calls = []
            for _ in range(n):
                x = [self._rand(q_shape, True), self._rand(kv_shape, True), self._rand(kv_shape, True)]
                outs = run(*x)
                douts = [torch.randn_like(o) for o in outs]
                if seed:  # the seed: .backward() into .grad, cleared before each call
                    calls.append(partial(_seed_backward, x, outs, douts))
                else:
                    calls.append(partial(torch.autograd.grad, outs, x, douts, retain_graph=True))
            return calls

        return [
            Op("sdpa_fwd", shape, flops, build_fwd, ctx, graph),
            Op("sdpa_bwd", shape, 2.5 * flops, build_bwd, ctx, graph),  # 5 GEMMs to the forward's 2
        ]

    def qkv_gemm(self, seq_len: int, world: int) -> list[Op]:
        """Flux's fused QKV projection on a rank's S/W tokens, weights (3h, h) as nn.Linear holds them."""
        hid, tokens = self.cfg.model.hidden, self.cfg.data.batch_size * seq_len // world
        x_shape, w_shape = (tokens, hid), (3 * hid, hid)
        n = self.nbuf(x_shape, w_shape, (tokens, 3 * hid))
        flops = 2 * tokens * hid * 3 * hid
        shape = f"({tokens},{hid})x({hid},{3 * hid})"

        def operands(grad):
            return [self._rand(x_shape, grad), self._rand(w_shape, grad), self._rand((3 * hid,), grad)]

        def build_fwd():
            return [partial(F.linear, *operands(True)) for _ in range(n)]

        def build_bwd():
            calls = []
            for _ in range(n):
                x = operands(True)
                y = F.linear(*x)  # (tokens, 3h)
                calls.append(partial(torch.autograd.grad, y, x, torch.randn_like(y), retain_graph=True))
            return calls

        return [Op("qkv_gemm_fwd", shape, flops, build_fwd), Op("qkv_gemm_bwd", shape, 2 * flops, build_bwd)]

    def seed_gemm(self, seq_len: int, world: int) -> Op:
        """The seed's "qkv gemm": q (B, H, S/W, D) @ (D, 3D), K = head_dim, not the real projection."""
        m, b = self.cfg.model, self.cfg.data.batch_size
        q_shape, w_shape = (b, m.num_heads, seq_len // world, m.head_dim), (m.head_dim, 3 * m.head_dim)

        def build():
            return [partial(torch.matmul, self._rand(q_shape), self._rand(w_shape))]

        return Op("qkv_gemm_fwd", f"{_fmt(q_shape)}x{_fmt(w_shape)}", 2 * math.prod(q_shape) * w_shape[1], build)

    def peak(self) -> Op:
        shape = (PEAK_N, PEAK_N)

        def build():  # bf16 whatever the run's precision: the tensor-core peak
            a, b = (torch.randn(2, *shape, device=self.device, dtype=torch.bfloat16) for _ in range(2))
            return [partial(torch.matmul, a[i], b[i]) for i in range(2)]

        return Op("gemm_peak", f"{_fmt(shape)}x{_fmt(shape)}", 2 * PEAK_N**3, build)


def _seed_backward(inputs, outs, grads):
    for x in inputs:
        x.grad = None
    torch.autograd.backward(outs, grads, retain_graph=True)


def _one_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _fmt(shape) -> str:
    return "(" + ",".join(map(str, shape)) + ")"


# ---------------------------------------------------------------- timing


class Timer:
    def __init__(self, cuda: bool, barrier: Callable, max_reps: int, reduce_max: Callable[[float], float] = float):
        self.cuda, self.barrier, self.max_reps = cuda, barrier, max_reps
        self.reduce_max = reduce_max  # ranks agree on the number of calls (each batch starts with a barrier)
        if cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(2 * BATCH)]

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def corrected(self, calls: list[Callable]) -> tuple[list[float], list[float]]:
        """(device ms, host ms) per call, after warm-up; inputs rotate over `calls`."""
        for i in range(max(2, len(calls))):  # every buffer once; the first call also pays for set-up
            t0 = time.perf_counter()
            calls[i % len(calls)]()
            host_est = (time.perf_counter() - t0) * 1e3  # host time to issue the call
            self.sync()
            est = (time.perf_counter() - t0) * 1e3  # and to run it
        reps = self.max_reps
        if self.cuda:
            reps = max(MIN_REPS, min(reps, int(BUDGET_MS / max(self.reduce_max(est), 1e-3))))
        dev, host = [], []
        for start in range(0, reps, BATCH):
            n = min(BATCH, reps - start)
            self.barrier()  # ranks start a batch together: their collectives meet
            if self.cuda:  # keep the device busy while the host queues the batch
                hold_stream(min(500.0, 1.5 * n * host_est + 0.2))
            for j in range(n):
                f = calls[(start + j) % len(calls)]
                if self.cuda:
                    self.events[2 * j].record()
                t0 = time.perf_counter()
                f()
                t1 = time.perf_counter()
                if self.cuda:
                    self.events[2 * j + 1].record()
                else:
                    dev.append((t1 - t0) * 1e3)
                host.append((t1 - t0) * 1e3)
            self.sync()
            if self.cuda:
                dev += [self.events[2 * j].elapsed_time(self.events[2 * j + 1]) for j in range(n)]
        return dev, host

    def seed(self, call: Callable) -> float:
        """The seed's loop: warm-up, barrier, event, `runs` calls, barrier, event; mean per call."""
        runs = min(SEED_RUNS, self.max_reps)
        if self.cuda:  # the seed's 10 + 20 calls, fewer where one call is long (100k tokens)
            t0 = time.perf_counter()
            call()
            self.sync()
            est = self.reduce_max((time.perf_counter() - t0) * 1e3)
            runs = max(MIN_REPS, min(runs, int(BUDGET_MS / max(est, 1e-3))))
        for _ in range(min(SEED_WARMUP, max(1, runs // 2))):
            call()
        self.barrier()
        if self.cuda:
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        for _ in range(runs):
            call()
        self.barrier()
        if not self.cuda:
            return (time.perf_counter() - t0) * 1e3 / runs
        z.record()
        torch.cuda.synchronize()
        return a.elapsed_time(z) / runs


def capture(build: Callable, stream) -> list[Callable]:
    """One CUDA graph per buffer's call, built and warmed up on the capture stream; returns their replays.

    The op is built on that stream too: autograd runs a backward op on its forward op's stream, so the
    forward that a backward call needs must have run on the stream being captured."""
    replays = []
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in build():
            for _ in range(2):  # lazy set-up (cuBLAS workspace, cuDNN plans) must not happen during capture
                call()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                call()
            replays.append(lambda g=g, call=call: g.replay())  # holds call: its tensors are the graph's inputs
    torch.cuda.current_stream().wait_stream(stream)
    return replays


# ---------------------------------------------------------------- one rank's run


class OpBench:
    def __init__(self, cfg: BenchConfig, rank: int, world_size: int, device: torch.device, barrier: Callable,
                 reduce_max: Callable[[float], float] = float):  # fmt: skip
        run = cfg.run
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.reduce_max = reduce_max  # max over ranks: every rank must measure the same rows, in order
        self.cuda = device.type == "cuda"
        self.device = device
        self.strategy = None if run.simulate_world else make_strategy(run.cp, rank, world_size, device,
                                                                      run.sdpa_backend, run.rotate,
                                                                      ulysses_qkv=run.ulysses_qkv)
        self.factory = OpFactory(cfg, self.strategy, device, self.cuda)
        self.timer = Timer(self.cuda, barrier, run.reps or (100 if self.cuda else CPU_REPS), reduce_max)
        self.rows: list[dict] = []
        self.notes: list[str] = []

    @property
    def sdpa_backend(self) -> str:  # the strategy's pick; before a simulated world's strategy exists, the setting
        return self.strategy.sdpa_backend if self.strategy else self.cfg.run.sdpa_backend

    def cases(self) -> list[tuple[int, int, bool]]:
        """(seq len, effective W, simulated), in the order they are measured."""
        run = self.cfg.run
        worlds = run.simulate_world or [self.world_size]
        return [(s, w, run.simulate_world is not None and w > 1) for s in run.seq_lens for w in worlds]

    def measure(self, op: Op, seq_len: int, world: int, simulated: bool, method="corrected", graph=False):
        with op.context():
            calls = capture(op.build, self.stream) if graph else op.build()
            if method == "seed-compat":
                ms = self.timer.seed(calls[0])
                dev, host = [ms], None
            else:
                dev, host = self.timer.corrected(calls)
        del calls
        med = statistics.median(dev)
        self.rows.append({
            "op": op.name, "seq_len": seq_len, "world": world, "simulated": simulated, "cp": self.cfg.run.cp,
            "method": method, "graph": graph, "sdpa_backend": self.sdpa_backend, "shape": op.shape,
            "device_ms": stats(dev), "host_ms": stats(host) if host else None,
            "flops": float(op.flops), "tflops": op.flops / (med * 1e-3) / 1e12,
        })  # fmt: skip

    def _simulate(self, world: int):
        """Become rank 0 of a `world`-rank job over the fake group, with the run's real strategy."""
        from flux_cp.parallel.fake_group import init_fake_world

        run = self.cfg.run
        init_fake_world(world, 0)
        self.strategy = self.factory.strategy = make_strategy(run.cp, 0, world, self.device, run.sdpa_backend,
                                                              run.rotate, ulysses_qkv=run.ulysses_qkv)

    def run_case(self, seq_len: int, world: int, simulated: bool):
        f, run = self.factory, self.cfg.run
        if run.simulate_world:
            self._simulate(world)
        ops = f.sdpa(seq_len, world) + f.qkv_gemm(seq_len, world)
        for op in ops:
            self.measure(op, seq_len, world, simulated)
        if run.graph:
            eager = {r["op"]: self.reduce_max(r["device_ms"]["median"]) for r in self.rows[-len(ops) :]}
            for op in ops:
                if op.graph is not True:
                    self._note(op.graph)
                elif eager[op.name] > GRAPH_MAX_MS:
                    self._note(f"graph: skipped for calls over {GRAPH_MAX_MS:g} ms (launch overhead is negligible)")
                else:
                    try:
                        self.measure(op, seq_len, world, simulated, graph=True)
                    except RuntimeError as e:  # keep the eager figures; say why there is no graph row
                        self._note(f"graph: capture of {op.name} at S={seq_len} W={world} failed: {_one_line(e)}")
        if run.seed_compat:
            for op in [*f.sdpa(seq_len, world, seed=True), f.seed_gemm(seq_len, world)]:
                self.measure(op, seq_len, world, simulated, method="seed-compat")

    def _note(self, text: str):
        if text not in self.notes:
            self.notes.append(text)

    def run(self, on_case_done: Callable | None = None):
        if self.cuda:
            self.stream = torch.cuda.Stream()
            self.measure(self.factory.peak(), 0, 1, False)  # rows[0]: the device's bf16 GEMM peak
        for case in self.cases():
            self.run_case(*case)
            if self.cuda:
                torch.cuda.empty_cache()  # the next case's shapes differ: give its buffers room
            if on_case_done:
                on_case_done()


# ---------------------------------------------------------------- summary, table, wandb


def build_summary(cfg: BenchConfig, bench: OpBench, env: dict, rank_medians=None, complete=False, error=None):
    run = cfg.run
    rows = bench.rows
    if rank_medians is not None:  # (world_size, rows): every rank's device median per row
        for row, hi, lo in zip(rows, rank_medians.max(0).values.tolist(), rank_medians.min(0).values.tolist()):
            row["device_ms"] |= {"rank_max_median": hi, "rank_min_median": lo}
    peak = next((r for r in rows if r["op"] == "gemm_peak"), None)
    s0, w0 = bench.cases()[0][:2]
    metrics = {}
    for r in rows:  # the contract's metrics: first seq len and W, corrected, eager
        if (r["seq_len"], r["world"], r["method"], r["graph"]) == (s0, w0, "corrected", False) and r["op"] in OPS:
            metrics[f"{r['op']}_ms"] = r["device_ms"]
            metrics[f"{r['op']}_host_ms"] = r["host_ms"]
    d = {
        "schema": 1, "mode": "ops", "run_name": run_name(cfg, "ops"), "group": run.group,
        "world_size": bench.world_size, "cp": run.cp, "simulate_world": (run.simulate_world or [None])[0],
        "collectives": "fake" if run.simulate_world else "real",
        "simulate_worlds": run.simulate_world, "config": cfg.to_dict(), "env": env, "params": None,
        "compile": {"enabled": False, "mode": None, "compile_s": None},
        "tokens_per_rank": s0 // w0, "sdpa_backend": bench.sdpa_backend, "seq_lens": run.seq_lens,
        "complete": complete, "metrics": metrics, "loss": [], "ops": rows,
        "peak_tflops": peak["tflops"] if peak else None, "notes": bench.notes,
    }  # fmt: skip
    if error:
        d["error"] = error
    return d


def print_table(d: dict, path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    peak = d["peak_tflops"]
    table = Table(title=f"{d['run_name']}  ({d['env']['device']}, sdpa backend {d['sdpa_backend']})")
    cols = ("op", "S", "W", "method", "graph", "shape", "device ms (min-max)", "host ms", "TFLOP/s", "% peak")
    for col in cols:
        table.add_column(col, justify="left" if col in ("op", "method", "shape") else "right")
    for r in d["ops"]:
        dev, host = r["device_ms"], r["host_ms"]
        table.add_row(
            r["op"], str(r["seq_len"]), f"{r['world']}{'*' if r['simulated'] else ''}", r["method"],
            "yes" if r["graph"] else "", r["shape"], f"{dev['median']:.4g} ({dev['min']:.4g}-{dev['max']:.4g})",
            f"{host['median']:.4g}" if host else "-", f"{r['tflops']:.4g}",
            f"{100 * r['tflops'] / peak:.0f}" if peak else "-",
        )  # fmt: skip
    console = Console()  # the result on stdout; warnings on stderr
    if not console.is_terminal:  # logs and pipes: wide enough for the shape column
        console.width = 180
    console.print(table)
    if any(r["simulated"] for r in d["ops"]):
        console.print("W*: simulated: rank 0 of a W-rank job over torch's fake process group "
                      "(collectives move nothing)", soft_wrap=True)
    for note in d["notes"]:
        console.print(f"note: {note}", soft_wrap=True)
    console.print(f"summary: {path}", soft_wrap=True)
    from flux_cp.runs.verdict import ops_verdict

    roots = [r for r in dict.fromkeys([Path("runs"), path.parent.parent]) if r.is_dir()]
    for line in ops_verdict(d, roots):
        console.print(line, soft_wrap=True, highlight=False, markup=False)


def log_wandb(cfg: BenchConfig, d: dict, out: Path) -> None:
    import wandb

    run = wandb.init(
        project="flux-cp", name=d["run_name"], group=cfg.run.group, job_type="ops", dir=str(out),
        mode=cfg.run.wandb_mode, config={**cfg.to_dict(), "env": d["env"]}, settings=wandb_settings(),
    )  # fmt: skip
    cols = ["op", "seq_len", "world", "simulated", "method", "graph", "shape", "device_ms", "host_ms", "tflops"]
    data = [[*(r[c] for c in cols[:7]), r["device_ms"]["median"], (r["host_ms"] or {}).get("median"), r["tflops"]]
            for r in d["ops"]]
    run.log({"ops": wandb.Table(columns=cols, data=data)})
    # as a train run's: the median under the metric's own name (wandb's run table), min/max/n beside it
    for name, m in ((k, m) for k, m in d["metrics"].items() if m):
        run.summary.update({name: m["median"], f"{name}/min": m["min"], f"{name}/max": m["max"], f"{name}/n": m["n"]})
    if d["peak_tflops"]:
        run.summary["peak_tflops"] = d["peak_tflops"]
    run.finish()


def run_ops(cfg: BenchConfig) -> int:
    """Entry point of --ops-only: Lightning Fabric starts the ranks (gloo on CPU, NCCL on GPU)."""
    import lightning as L

    run = cfg.run
    out = Path(run.output)
    distributed = run.devices > 1 or (run.cp == "torch" and not run.simulate_world)  # torch CP needs a mesh
    fabric = L.Fabric(accelerator=run.accelerator, devices=run.devices, strategy="ddp" if distributed else "auto")
    return fabric.launch(_rank_main, cfg, out)


def _rank_main(fabric, cfg: BenchConfig, out: Path) -> int:
    def reduce_max(x: float) -> float:
        return fabric.all_reduce(torch.tensor(x, device=fabric.device), reduce_op="max").item()

    bench = OpBench(cfg, fabric.global_rank, fabric.world_size, fabric.device, fabric.barrier, reduce_max)
    env = env_info(fabric.device)
    path = out / "summary.json"

    def flush():
        if fabric.global_rank == 0:
            write_json_atomic(path, build_summary(cfg, bench, env))

    try:
        bench.run(on_case_done=flush)
    except Exception as e:  # keep what was measured
        if fabric.global_rank == 0:
            err = "".join(traceback.format_exception_only(type(e), e)).strip()
            write_json_atomic(path, build_summary(cfg, bench, env, error=err))
        raise
    warnings.filterwarnings("ignore", ".*all_gather is deprecated.*")  # Lightning's own call, torch >= 2.13
    medians = torch.tensor([r["device_ms"]["median"] for r in bench.rows], dtype=torch.float64, device=fabric.device)
    spread = fabric.all_gather(medians).reshape(fabric.world_size, -1).cpu() if fabric.world_size > 1 else None
    if fabric.global_rank != 0:
        return 0
    d = build_summary(cfg, bench, env, spread, complete=True)
    write_json_atomic(path, d)  # before wandb: a wandb failure loses nothing
    print_table(d, path)
    if cfg.run.wandb_mode != "disabled":
        try:
            log_wandb(cfg, d, out)
        except Exception as e:  # summary.json is already complete: report, do not fail the run
            print(f"train_bench.py: wandb failed ({_one_line(e)}); summary.json is complete", file=sys.stderr)
    return 0
