"""The bare reference (--harness bare): the Lightning run's training step in a plain PyTorch loop.

    python scripts/train_bench.py --harness bare --simulate-world 2 --cp torch     # any configuration's twin

No Trainer, no callbacks, no loader: the model, CP strategy, weights mode (DDP with the same comm hook, ZeRO,
FSDP2), precision, compile setting and (simulated) world are built as the Lightning run builds them, the same
FluxStep (flux_cp/train/step.py) runs each step, every batch is made on the device before the loop, and each step
records one pair of events; the ledger records warm-up steps and every --regions-every'th measured step ("timed",
out of step_ms), as the Lightning run's instrumented steps; on CUDA every --idle-probe-every'th measured step is
an idle probe as the Lightning run's (device_busy_ms, host_issue_ms; the step after it apart: step_after_probe_ms),
which waits for its own last event before the next step. Nothing is read until the loop ends. The Lightning
run's step is held against this one (the report's harness overhead); their losses agree step for step. With
--devices N this process is rank 0 and starts ranks 1..N-1 as copies of its own command line (as Lightning's
launcher does): gloo on CPU, NCCL on GPUs.
"""

import contextlib
import datetime
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist

from flux_cp.checks import cpu_threads
from flux_cp.config import DDP_WEIGHTS, BenchConfig
from flux_cp.data import DTYPES, device_batches
from flux_cp.measure.ledger import ledger_for
from flux_cp.measure.live_memory import LiveWindow
from flux_cp.measure.timing import (
    StepTimer,
    instrumented,
    probe_figures,
    probe_kind,
    spin_cycles_per_ms,
    sync_allowed,
    timed_names,
)
from flux_cp.model import num_params
from flux_cp.parallel.fake_group import allreduce_hook, init_fake_world
from flux_cp.parallel.mesh import build_mesh, build_optimizer, full_grads, full_params, optimizer_numel, shard_weights
from flux_cp.parallel.tp import ignore_in_ddp, shard_model
from flux_cp.runs import interrupt
from flux_cp.runs.failures import EXIT_CODES, error_kind, error_line, error_trace, kill_tree
from flux_cp.runs.header import train_header
from flux_cp.runs.results import (
    RunSummary,
    gather_row,
    peak_memory,
    record_host_speed,
    reset_peak_memory,
    run_start_time,
    wall_split,
)
from flux_cp.train.step import FluxStep, build_model, default_dtype, init_device


def _launch_ranks(run, command: list[str]) -> list[subprocess.Popen]:
    """Ranks 1..N-1: this run's command line again, told its rank by the environment (rank 0 is this process)."""
    if run.devices == 1 or "RANK" in os.environ:
        return []
    port = os.environ.get("MASTER_PORT") or str(_free_port())
    os.environ.update(MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"), MASTER_PORT=port,
                      WORLD_SIZE=str(run.devices), RANK="0", LOCAL_RANK="0")
    return [subprocess.Popen(command, env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)})
            for r in range(1, run.devices)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_world(run) -> None:
    """The process group the Lightning run would have: a fake one for a simulated rank, a real one for several
    ranks, and one of a single rank where Lightning's DDP makes one too (torch's CP, FSDP)."""
    if run.simulate_world:
        init_fake_world(run.simulate_world, run.simulate_rank)
    elif run.world_size > 1 or run.cp == "torch" or run.weights not in DDP_WEIGHTS:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("nccl" if run.accelerator == "gpu" else "gloo",
                                rank=int(os.environ.get("RANK", 0)), world_size=run.world_size,
                                timeout=datetime.timedelta(seconds=run.timeout_s))


def wrap_for_training(model, run, device, cp_mesh=None, dp_mesh=None):
    """(what the step calls, the optimizer): DDP with the project's comm hook (as flux_cp.train.strategies.DDPWithHook),
    ZeRO's optimizer, or FSDP2 over all ranks (as Lightning's ModelParallelStrategy). --cp tp: the weights sharded
    over cp_mesh first (as the LightningModule's configure_model does)."""
    if run.cp == "tp" and cp_mesh is not None:
        dp_group = dp_mesh.get_group() if dp_mesh is not None and run.dp > 1 else None  # dp x tp: its groups
        ignore_in_ddp(model, shard_model(model, cp_mesh.get_local_rank(), cp_mesh.size(), cp_mesh.get_group(),
                                         dp_group, run.dp))
    if run.weights == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh

        shard_weights(model, init_device_mesh(device.type, (run.world_size,), mesh_dim_names=("data_parallel",)), run)
        return model, build_optimizer(model, run, device)
    if not dist.is_initialized() or run.weights not in DDP_WEIGHTS:  # ZeRO-2: the optimizer syncs
        return model, build_optimizer(model, run, device)
    from torch.nn.parallel import DistributedDataParallel

    # --step-graph: DDP built on a side stream, as torch's CUDA graphs notes require for whole-network capture (its
    # reducer otherwise works on the legacy default stream, which a capture on another stream cannot depend on)
    stream = torch.cuda.Stream(device) if run.step_graph else None
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                      gradient_as_bucket_view=run.grad_bucket_view)
    if stream is not None:
        torch.cuda.current_stream(device).wait_stream(stream)  # its broadcast of the weights, before the first step
    ddp.register_comm_hook(None, allreduce_hook)
    return ddp, build_optimizer(model, run, device)


def run_bare(cfg: BenchConfig, command: list[str], report=None) -> int:
    """Train cfg's steps in a plain loop; the report rank writes summary.json (and calls report(summary, path)).
    command: the run's command line, which ranks 1..N-1 run again (--devices N)."""
    run = cfg.run
    procs = _launch_ranks(run, command)
    try:
        rc = _run(cfg, report)
    except BaseException as e:
        kill_tree(os.getpid())  # the other ranks, if any (e.g. waiting in a collective)
        print(f"train_bench.py: rank {os.environ.get('RANK', 0)}: bare run failed ({error_kind(e)}): {error_line(e)}",
              file=sys.stderr)
        return EXIT_CODES[error_kind(e)]
    return max([rc, *(p.wait() for p in procs)])


def _run(cfg: BenchConfig, report) -> int:
    run, data = cfg.run, cfg.data
    t_run = run_start_time()
    device = init_device(run.accelerator)  # where Lightning's strategy would put this rank (LOCAL_RANK)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # OMP_NUM_THREADS, else the cores shared out over the ranks, as Lightning's launcher does
        torch.set_num_threads(cpu_threads(run))
    _init_world(run)
    rank = run.simulate_rank if run.simulate_world else (dist.get_rank() if dist.is_initialized() else 0)
    dtype = DTYPES[run.precision]
    # fp32 init, then the run's precision (Lightning's plugin does the same); FSDP2's CPU offload: cast on the host,
    # and fully_shard moves a unit at a time to the GPU to shard it (Flux.1 whole would hold 22 GiB of it meanwhile)
    model = build_model(cfg).to(None if run.fsdp_cpu_offload else device, dtype)
    mesh = build_mesh(device.type, run.dp, run.cp_degree)
    fwd, opt = wrap_for_training(model, run, device, *((mesh["cp"], mesh["dp"]) if mesh is not None else ()))
    timer = StepTimer(cuda=device.type == "cuda", enabled=False, ledger=ledger_for(run))  # one event pair per step
    step = FluxStep(cfg, model, device, mesh["cp"] if mesh is not None else None, timer)
    n = run.warmup_steps + run.steps
    batches = device_batches(data, cfg.model, n, rank // run.cp_degree, run.dp, dtype, device)
    gloo = None  # the gather of every rank's figures after the loop, on the CPU
    if dist.is_initialized() and dist.get_world_size() > 1 and not run.simulate_world:
        gloo = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")

    header = train_header(cfg, num_params(model)) | {"sdpa_backend": step.strategy.sdpa_backend,
                                                     "sdpa_kernel": step.sdpa_kernel,
                                                     "optimizer_params": optimizer_numel(opt)}
    summary = RunSummary(Path(run.output) / "summary.json", header, run.warmup_steps)
    reset_peak_memory(timer.cuda)  # as the Lightning run: from the loop's start, model and batches in place
    records, wall = [], {"start": time.time()}
    every = run.idle_probe_every if timer.cuda else 0
    if every:
        spin_cycles_per_ms()  # calibrated (it synchronises) before any step, not inside the first probe
        summary.header["probe_hold_ms"] = []
    host_ms, live = 0.0, LiveWindow(run)
    shape = {"seq_len": data.seq_len, "batch": data.batch_size, "world": run.world_size}
    if (guard := interrupt.active()) is not None:  # stopped by a signal (the launcher, the reporting rank, runs this)
        guard.add(lambda signum: _stopped(summary, timer, records, run, rank, shape, signum))
    try:
        with default_dtype(dtype):  # as Lightning's precision plugin around training_step
            for i, batch in enumerate(batches):
                # an idle probe (as the Lightning run's, its schedule): the stream held longer than the host needs
                probe = probe_kind(i - run.warmup_steps, every)
                hold = 1.5 * host_ms + 2.0 if probe == "probe" else 0.0
                live.before_step(i)  # a CPU's peak in tensors' bytes: the first warm-up steps, outside the clock
                timer.start_step(regions=False, probe_ms=hold, comm=not probe and _ledger_step(i, run))
                rec = timer.end_step(step(fwd, opt, batch))
                live.after_step(i)
                host_ms = (rec["host1"] - rec["host0"]) * 1e3
                if probe == "probe":  # its backlog drained before the next step, as the Lightning run's probe
                    summary.header["probe_hold_ms"].append(round(hold, 3))
                    with sync_allowed(True):
                        rec.get("ready", rec["dev1"]).synchronize()
                records.append(rec | {"kind": probe})
                if i + 1 == run.warmup_steps:
                    wall["warm"] = time.time()
                if run.dump_grads and i == 0:
                    _save(rank, run, full_grads(model), "grads_step0.pt")
        step.finish(opt)
        wall["end"] = time.time()
        summary.header["memory"] = peak_memory(timer.cuda, live.peak_bytes)  # this rank's, over the steps
        if step.contention is not None:  # --contention: what it put on the device
            summary.header["contention"] = step.contention.summary()
        if run.dump_params:
            _save(rank, run, full_params(model), "params_final.pt")
    except BaseException as e:  # what was measured is kept: this rank's own figures, complete: false
        live.close()
        try:
            _add_steps(summary, timer, records, None, run)
        except Exception:  # a step that cannot be read (e.g. after a CUDA error): the earlier ones are in
            pass
        summary.record_error(rank, error_line(e), error_kind(e), shape, trace=error_trace(e))
        raise
    _add_steps(summary, timer, records, gloo, run)
    step.close()
    try:
        if rank == (run.simulate_rank if run.simulate_world else 0):  # written before the group goes: kept on a hang
            record_host_speed(summary.header)  # did the host's speed change over the steps
            summary.header["wall_s"] = wall_split(t_run, wall["start"], wall.get("warm", wall["start"]),
                                                  wall["end"], time.time())
            path = summary.write(complete=True)
            if report is not None:
                report(summary.to_dict(complete=True), path)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _ledger_step(i: int, run) -> bool:
    """Whether step i records the ledger: warm-up steps (a CUDA graph's capture among them) and the instrumented
    measured steps, as the Lightning run's "timed" steps; the others are plain (flux_cp/measure/ledger.py: why)."""
    return i < run.warmup_steps or instrumented(i - run.warmup_steps, run.regions_every)


def _stopped(summary, timer, records, run, rank: int, shape: dict, signum: int) -> None:
    """The stop thread (flux_cp/runs/interrupt.py): the steps so far (this rank's: no gather), complete: false."""
    import signal

    with contextlib.suppress(Exception):  # a step that cannot be read: the summary keeps the earlier ones
        _add_steps(summary, timer, list(records), None, run)
    summary.record_error(rank, f"{signal.Signals(signum).name}: stopped", "interrupted", shape)


def _add_steps(summary: RunSummary, timer: StepTimer, records: list[dict], gloo, run) -> None:
    """Every step read (after the loop: waiting is allowed now), gathered over the ranks, into the summary. Steps
    that recorded the ledger are "timed" (their figures *_timed_ms, out of step_ms), probes and the steps after them
    under their own names, the rest "plain"."""
    rows = []
    for i, rec in enumerate(records):
        f = timer.read(rec, wait=True)
        if i + 1 < len(records):  # the host's period from this step's start to the next's
            f["loop_ms"] = (records[i + 1]["host0"] - rec["host0"]) * 1e3
        rows.append((rec.get("kind") or ("timed" if i >= summary.warmup_steps and "comm" in f else "plain"), f))
    for i, (kind, f) in enumerate(rows):
        keys = [k for k in ("step_ms", "host_ms", "loop_ms") if k in f]
        if kind in ("probe", "settle"):  # their figures under their own names (device_busy_ms, ...)
            f = f | probe_figures(kind, f)
            keys = list(probe_figures(kind, f))
        every = gather_row([f[k] for k in keys] + [f["loss"]], gloo)  # same steps and keys on every rank: they pair
        vmax, vmin = every[:, :-1].max(0).values.tolist(), every[:, :-1].min(0).values.tolist()
        names = list(timed_names(dict.fromkeys(keys), run.regions_every)) if kind == "timed" else keys
        summary.add_step(i, every[:, -1].mean().item(), dict(zip(names, every[0, :-1].tolist())),
                         dict(zip(names, vmax)), dict(zip(names, vmin)))
        if "comm" in f:
            summary.add_comm(i, kind, f["step_ms"], f["comm"])
    if kinds := Counter(kind for kind, _ in rows[summary.warmup_steps:]):
        summary.header["step_kinds"] = dict(kinds)


def _save(rank: int, run, tensors: dict, name: str) -> None:
    if rank == 0:
        torch.save(tensors, Path(run.output) / name)
