"""OpTimingCallback: step and op timings of every training step, to summary.json and the logger.

Per step it opens the module's StepTimer before the step and closes it after (optimizer
included). Between steps it does nothing else: every step's events (and its loss, copied to the host
asynchronously right after it) are read after the loop, as the bare loop (flux_cp/train/bare.py) reads
its own. Where the host issues a step about as fast as the device runs it (CP at W >= 2), whatever the
host does between steps is step time: on an H200 the former reads of finished steps inside the loop
(events, the ledger's collectives, the logger, summary.json rewrites) took 1.5-12 ms a step
(`after_ms`, docs/archive/2026-12-03-h200-recipes.md), 2-10% of the step. Only a run of more than
MAX_PENDING steps reads inside the loop (steps that finished, `Event.query()`, never a wait), to bound
what it holds. With several ranks every rank's figures and loss are gathered on the CPU (gloo) after
the loop. Rank 0 (or a simulated rank) logs them (Lightning logger API, so a logger sees the steps
once training ends) and keeps the summary; summary.json records where the reads happened (`reads`).
Warm-up steps are run and their loss kept, but their timings stay out of the statistics; so do
profiled steps (--profile: extra steps right after warm-up, slowed by the profiler itself).

Each measured step has a kind (`step_kind`), the same on every rank. The step's own figures come from
steps that carry nothing the bare loop (flux_cp/train/bare.py) does not: at W >= 2 the host issues a step about
as fast as the device runs it, and on an H200 op regions every step and a probe every 4th made the Lightning
step 8-24% longer than its bare twin at W = 4 and 8 (docs/archive/2026-12-03-h200-regimes.md).
- "plain": no regions -> step_ms, host_ms, and the loop's
  pace: loop_ms (host wall time from this step's start to the next's: data loading included, unlike
  step_ms), data_ms
  (host time from the end of this callback's hooks of the last step to the batch leaving the loader: the
  loader's wait and the loop's other hooks), transfer_ms (Lightning's copy of the batch to the device),
  prologue_ms (from there to this step's start: Lightning's hooks, this one's included) and after_ms (this
  callback's hook after the step: reading finished steps, logging). A step's loop_ms is its host_ms + after_ms and
  the next step's data_ms + transfer_ms + prologue_ms, exactly (shared stamps): the host's whole period;
  gc_ms is the part of that period Python's garbage collector took (wherever it struck);
- "timed" (every --regions-every'th measured step, with --timing or the ledger): op regions on -> sdpa_*/qkv_gemm_*,
  the ledger records the step's collectives (flux_cp/measure/ledger.py: its kernels are registered in these steps only),
  and the step itself as step_timed_ms / host_timed_ms / loop_timed_ms (timing_overhead_pct: the instruments' cost,
  in one process); with --regions-every 1 every step is timed and gives step_ms;
- "probe" (CUDA, every --idle-probe-every'th step): the host runs ahead of the device ->
  device_busy_ms, from which summary.json's device idle fraction comes, and host_issue_ms (the host's own time to
  issue the step: nothing to wait for; the report's host model scales it). A probe leaves the device a
  backlog (the spin, then the step's kernels) that a host-bound loop drains by only host - busy ms a
  step: measured on an H200 at W=2 (host ~65, busy ~51 ms), the steps after a probe ran from it for
  several steps, device bound, and the step median fell below the bare loop's. So the probe ends by
  waiting for its own last event (out of the statistics, like the probe);
- "settle": the step after a probe starts on an idle device, which a host-bound loop never does ->
  step_after_probe_ms only.

Every rank keeps the (gathered) summary, so that whichever rank fails can write what was measured.
"""

import gc
import statistics
import time
from pathlib import Path

import torch.distributed as dist
from lightning.pytorch import Callback

from flux_cp.measure.flops import throughput
from flux_cp.measure.live_memory import LiveWindow
from flux_cp.measure.timing import (
    GcClock,
    instrumented,
    probe_figures,
    probe_kind,
    spin_cycles_per_ms,
    sync_allowed,
    timed_names,
)
from flux_cp.parallel.fake_group import is_fake
from flux_cp.runs.failures import error_kind, error_line, error_trace
from flux_cp.runs.results import (
    RunSummary,
    flat_stats,
    gather_row,
    peak_memory,
    record_host_speed,
    reset_peak_memory,
    run_start_time,
)
from flux_cp.runs.throughput import work_of

# The parts of a step's loop period (loop_ms) kept in its step record; see the module docstring.
LOOP_PARTS = ("data_ms", "transfer_ms", "prologue_ms", "after_ms", "gc_ms")
MAX_PENDING = 2048  # unread steps held (a few events and a host scalar each) before the loop reads finished ones


class OpTimingCallback(Callback):
    def __init__(
        self,
        summary_path: Path,
        header: dict,
        warmup_steps: int,
        profile_steps: int = 0,
        regions_every: int = 4,
        idle_probe_every: int = 8,
        flush_every_s: float = 1.0,
        report_rank: int = 0,
        max_pending: int = MAX_PENDING,
    ):
        self.summary = RunSummary(summary_path, header, warmup_steps + profile_steps)
        self.summary.header["probe_hold_ms"] = []  # each idle probe's stream hold (CUDA)
        self.warmup_steps = warmup_steps
        self.skip = warmup_steps + profile_steps  # steps kept out of the statistics
        self.regions_every = regions_every
        self.idle_probe_every = idle_probe_every
        self.flush_every_s = flush_every_s  # summary.json rewrites while measuring: at most this often
        self.report_rank = report_rank  # the rank that writes summary.json and logs: 0, or the simulated rank
        self.max_pending = max_pending  # unread steps held before the loop reads finished ones (long runs)
        self._flushed = 0.0
        self.last: dict[str, float] = {}  # this rank's figures of the last step (the profiler reads them)
        self._host_ms = 0.0  # the last step's issue time (host clock): how long a probe must hold the stream
        self._kind = "timed"  # this step's kind, set at its start
        self._pending: list[tuple] = []  # finished steps not read yet: (batch_idx, kind, step)
        self._read: list[tuple] = []  # read, not yet gathered (several ranks): (batch_idx, kind, figures)
        self._host0: dict[int, float] = {}  # each step's start (host clock): a step's loop_ms runs to the next's
        self._lags: list[int] = []  # measured steps: how many steps later than its own end each was read
        # measured steps' reads, where (probe steps apart: they end by waiting for the device on purpose)
        self._reads = {"in_loop": 0, "after_loop": 0, "waited_in_loop": 0, "probe_drains": 0}
        self._elapsed_s = 0.0  # the logged steps' own times (events) summed: the time axis of the logger's rows
        self._work: dict | None = None  # runs.throughput.work_of's figures for the rows' throughput
        self._kinds: dict[str, int] = {}  # measured steps read, by kind (summary.json step_kinds)
        self._in_loop = False
        self.wall: dict[str, float] = {}  # epoch seconds: the run's start, first step, warm-up end, last step end
        self._group = None  # gloo group for the gather after the loop (None: one rank)
        self._t0 = 0.0
        self._t_end = 0.0  # when the last step's hooks ended (host clock)
        self._between: dict[str, float] = {}  # this step's data_ms, transfer_ms, prologue_ms
        self._ended: dict | None = None  # the last step closed: its loop period runs until the next step starts
        self._gc = GcClock()  # Python's collections: gc_ms, the part of a step's loop_ms spent in them
        self.twin = None  # callbacks/twin.py's BareTwinCallback, when --interleave-bare is on
        self._trainer = self._module = None  # for the stop thread (stopped), from on_train_start
        self._stopping = False  # the stop thread is recording: nothing goes to the logger any more
        self._live: LiveWindow | None = None  # a CPU run's live-tensor count, from on_train_start

    def step_kind(self, batch_idx: int, cuda: bool, instruments: bool) -> str:
        """instruments: the run has op regions (--timing) or a ledger; they run in warm-up and "timed" steps."""
        j = batch_idx - self.skip  # index among measured steps
        if j < 0:  # warm-up (and profiled steps): instruments on, so that any recompilation or CUDA graph capture
            return "warmup" if instruments else "plain"  # they cause happens here (the ledger learns captures)
        if cuda and (probe := probe_kind(j, self.idle_probe_every)):
            return probe
        if instruments and instrumented(j, self.regions_every):
            return "timed"
        return "plain"

    def on_train_start(self, trainer, pl_module):  # after the module's on_fit_start built the strategy
        # the backend the strategy actually uses (`auto` can be pinned, e.g. flash under torch CP)
        self._trainer, self._module = trainer, pl_module
        self._live = LiveWindow(pl_module.cfg.run)
        self.summary.header["sdpa_backend"] = pl_module.step.strategy.sdpa_backend
        self.summary.header["sdpa_kernel"] = pl_module.step.sdpa_kernel  # what that setting ran
        self.summary.header["optimizer_params"] = pl_module.optimizer_params  # this rank's share under ZeRO
        # a fake group (simulated rank) has no one to gather from: the figures are this rank's own
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and not is_fake():
            self._group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        if pl_module.timer.cuda and self.idle_probe_every:
            spin_cycles_per_ms()  # calibrated (it synchronises) before any step, not inside the first probe
        gc.callbacks.append(self._gc)
        reset_peak_memory(pl_module.timer.cuda)  # the model, optimizer state and batches are in place by now
        self._t0 = time.perf_counter()
        self.wall = {"run": run_start_time(), "start": time.time()}
        if trainer.global_rank == self.report_rank:  # on disk before any step: what ran, should the process be killed
            self.summary.write(complete=False)
        self._in_loop = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        timer = pl_module.timer
        kind = self._kind = self.step_kind(batch_idx, timer.cuda, timer.enabled or timer.ledger is not None)
        probe_ms = 1.5 * self._host_ms + 2.0 if kind == "probe" else 0.0  # longer than the host needs to issue
        # The host's time between the last step's hooks and this one: the loader's next batch, then Lightning's
        # copy to the device (the module stamps both hooks), as torchtitan's data_loading time.
        marks = pl_module.batch_marks
        between = self._t_end and marks.get("fetched", 0) > self._t_end
        gc_ms = self._gc.take()  # collections since the last step started: in its loop period
        if self._ended is not None:
            self._ended["gc_ms"] = gc_ms
        if probe_ms:  # summary.json: each probe's hold (it must exceed the step's issue time, or busy reads as step)
            self.summary.header["probe_hold_ms"].append(round(probe_ms, 3))
        # a CPU's peak in tensors' bytes, as the bare loop's (flux_cp/measure/live_memory.py): first warm-up steps;
        # its window opens before the step's clock starts
        self._live.before_step(batch_idx)
        on = kind in ("timed", "warmup")  # the instruments: op regions (--timing) and the ledger
        # the step's start, as the timer stamps it: the loop's period and its parts share their ends (nothing between)
        host0 = self._host0[batch_idx] = timer.start_step(regions=on, probe_ms=probe_ms, comm=on)
        self._between = {"data_ms": (marks["fetched"] - self._t_end) * 1e3,
                         "transfer_ms": (marks["transferred"] - marks["fetched"]) * 1e3,
                         "prologue_ms": (host0 - marks["transferred"]) * 1e3} if between else {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = self._ended = pl_module.timer.end_step(outputs["loss"]) | self._between
        self._live.after_step(batch_idx)
        # how long the host took to issue it (host clock: nothing to read from the device), for the next probe's hold
        self._host_ms = (step["host1"] - step["host0"]) * 1e3
        if batch_idx + 1 == self.warmup_steps:  # warm-up wall time: compilation, autotuning, allocator growth
            self.summary.header["warmup_s"] = time.perf_counter() - self._t0
            self.summary.header["warmup_steps"] = self.warmup_steps
        if batch_idx + 1 == self.skip:
            self.wall["warm"] = time.time()
        self._pending.append((batch_idx, self._kind, step))
        if self.warmup_steps <= batch_idx < self.skip:  # profiled: read at once (the profiler reads `last`; it syncs)
            self._drain(trainer, pl_module, batch_idx, wait=True)
        if self._kind == "probe":  # its backlog drained (see the docstring): every step up to it is done after this
            with sync_allowed(True):
                step.get("ready", step["dev1"]).synchronize()
            self._reads["probe_drains"] += 1
        if len(self._pending) > self.max_pending:  # a long run: finished steps at least a step old (loop_ms is known)
            self._drain(trainer, pl_module, batch_idx - 1)
        self._t_end = time.perf_counter()
        step["after_ms"] = (self._t_end - step["host1"]) * 1e3  # this hook after the step: reads, logging

    def _drain(self, trainer, pl_module, upto: int, wait: bool = False):
        """Read pending steps up to batch_idx `upto`, in order, while they have finished on the device (or, with
        wait, until they have: after the loop, or profiled steps)."""
        timer = pl_module.timer
        while self._pending and self._pending[0][0] <= upto and (wait or timer.ready(self._pending[0][2])):
            batch_idx, kind, step = self._pending.pop(0)
            waits = timer.waits
            with sync_allowed(timer.cuda):  # a wait here is after the loop (or in a profiled step): not a stall
                local = timer.read(step, wait=wait)
            if batch_idx >= self.skip:  # a measured step: where it was read
                self._reads["in_loop" if self._in_loop else "after_loop"] += 1
                self._reads["waited_in_loop"] += self._in_loop and timer.waits > waits
                if self._in_loop:
                    self._lags.append(max(self._host0) - batch_idx)
            nxt = self._host0.get(batch_idx + 1)
            if nxt is not None:  # the next step has started: the loop's period, as the host sees it
                local["loop_ms"] = (nxt - self._host0[batch_idx]) * 1e3
            local |= {k: step[k] for k in LOOP_PARTS if k in step}
            self._read.append((batch_idx, kind, local))
            self.last = self._figures(kind, {k: v for k, v in local.items() if k not in ("loss", "comm")})
            if self._group is None:  # one rank: nothing to gather, the summary grows as steps are read
                self._ingest(trainer, *self._read.pop())

    def _ingest(self, trainer, batch_idx, kind, local, collective: bool = True):
        """A read step into the summary and the logger: every rank's figures (gathered), the global loss."""
        local = dict(local)
        loss = local.pop("loss")
        comm = local.pop("comm", None)
        step_ms = local["step_ms"]  # a probe step's is its busy time (renamed below)
        local = self._figures(kind, local)
        if batch_idx >= self.skip:
            self._kinds[kind] = self._kinds.get(kind, 0) + 1
            self.summary.header["step_kinds"] = dict(self._kinds)
        keys = sorted(local)  # same on every rank: the kind and the steps started are
        every = gather_row([local[k] for k in keys] + [loss], self._group if collective else None)  # (W, M + 1)
        loss = every[:, -1].mean().item()  # equal shards of equally many samples: global loss = mean over dp x cp ranks
        vmax, vmin = every[:, :-1].max(0).values.tolist(), every[:, :-1].min(0).values.tolist()
        rank0 = dict(zip(keys, every[0, :-1].tolist()))  # the summary's per-step figures are rank 0's
        self.summary.add_step(batch_idx, loss, rank0, dict(zip(keys, vmax)), dict(zip(keys, vmin)))
        if comm is not None:
            self.summary.add_comm(batch_idx, kind, step_ms, comm)
        if trainer.global_rank != self.report_rank:
            return
        if trainer.logger is not None and not self._stopping:
            row = self._row(trainer.world_size, batch_idx, kind, step_ms, loss, local, keys, vmax, vmin)
            trainer.logger.log_metrics(row, step=batch_idx)
        # Written at every step out of the statistics, then at most every flush_every_s: a write (JSON + fsync) in
        # every step would be host time between steps. A failing run writes everything it read (on_exception).
        now = time.perf_counter()
        if self._in_loop and (batch_idx < self.skip or now - self._flushed >= self.flush_every_s):
            self.summary.write(complete=False)
            self._flushed = now

    def _row(self, ranks, batch_idx, kind, step_ms, loss, local, keys, vmax, vmin) -> dict:
        """One step's logger row. Warm-up steps' figures under warmup/ (out of the measured series, whose summary is
        the median); every row carries `elapsed_s`, the steps' own times summed (the rows are logged after the loop,
        so their wall-clock stamps say nothing), and a measured plain step its throughput."""
        self._elapsed_s += step_ms / 1e3
        pre = "warmup/" if batch_idx < self.skip else ""
        row = {"loss": loss, "elapsed_s": self._elapsed_s, **{pre + k: v for k, v in local.items()}}
        if ranks > 1:
            row |= {f"{pre}rank_max/{k}": v for k, v in zip(keys, vmax)}
            row |= {f"{pre}rank_min/{k}": v for k, v in zip(keys, vmin)}
        if not pre and kind == "plain":
            if self._work is None:  # the run's work a step: the same for every row
                self._work = {k: v for k, v in work_of(self.summary.header).items()
                              if k in ("world", "samples", "seq_len", "fwd_flops", "peak")}
            t = throughput(step_ms, **self._work)
            row |= {k: v for k, v in t.items() if k.startswith("throughput/")}
        return row

    def wandb_summary(self) -> dict:
        """The run's figures as summary.json holds them (its final write, which this follows): each metric's median
        under its own name, min, max and n beside it (wandb's run table and comparisons read the summary, which
        would otherwise keep the last step's), its throughput, and `ranked/...`, what the dashboards rank by (a
        simulated rank's with its collectives priced: runs/throughput.py)."""
        out, final = {}, self.summary.final
        for name, m in final["metrics"].items():
            out |= flat_stats(name, m)
            if "rank_max_median" in m:
                out |= {f"rank_max/{name}": m["rank_max_median"], f"rank_min/{name}": m["rank_min_median"]}
        out |= {k: v for k, v in final["throughput"].items() if isinstance(v, (int, float)) and v is not None}
        eff = final["throughput"].get("efficiency") or {}  # --profile: where the MFU goes, by part
        for part in ("gemm", "attention"):
            out |= {f"efficiency/{part}_{k}": v for k, v in (eff.get(part) or {}).items() if v is not None}
        out |= {f"efficiency/{k}": eff[k] for k in ("rest_ms", "idle_ms") if eff.get(k) is not None}
        out |= {f"ranked/{k}": v for k, v in final["ranked"].items() if v is not None}
        return out | self.summary.derived()

    def _figures(self, kind: str, local: dict) -> dict:
        """A step's figures under the names its kind gives them."""
        if kind in ("probe", "settle"):
            return probe_figures(kind, local)
        if kind == "timed":  # plain steps give step_ms
            return timed_names(local, self.regions_every)
        return local

    def _finish_reads(self, trainer, pl_module, collective: bool) -> None:
        """After the loop: read what is left (waiting is allowed now), then gather every rank's figures."""
        self._in_loop = False
        self._drain(trainer, pl_module, float("inf"), wait=True)
        while self._read:  # in step order on every rank: the gathers pair up
            self._ingest(trainer, *self._read.pop(0), collective=collective)
        lags = self._lags or [0]
        self.summary.header["reads"] = self._reads | {"lag_steps_median": statistics.median(lags),
                                                      "lag_steps_max": max(lags)}

    def on_train_end(self, trainer, pl_module):
        self._remove_gc_hook()
        self.wall["end"] = time.time()
        peak = 0
        if self._live is not None:  # (closed by now unless the run had fewer steps than its window)
            self._live.close()
            peak = self._live.peak_bytes
        self.summary.header["memory"] = peak_memory(pl_module.timer.cuda, peak)  # this rank's, over the steps
        record_host_speed(self.summary.header)  # did the host's speed change over the steps
        if pl_module.step is not None and pl_module.step.contention is not None:  # --contention: what it issued
            self.summary.header["contention"] = pl_module.step.contention.summary()
        self._finish_reads(trainer, pl_module, collective=True)
        if self.twin is not None:  # the bare twin's steps against this rank's plain steps, read by now
            plain = [x for x in self.summary.per_step.get("step_ms", []) if x is not None]
            self.summary.header["interleaved_bare"] = self.twin.figures(plain)
        if trainer.global_rank != self.report_rank:
            return
        self.summary.write(complete=True)  # before the logger is finalised: a wandb failure loses nothing
        if hasattr(trainer.logger, "log_summary"):  # wandb's run table (ResilientWandbLogger)
            trainer.logger.log_summary(self.wandb_summary())

    def _remove_gc_hook(self):
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)

    def on_exception(self, trainer, pl_module, exception):
        self._remove_gc_hook()
        if self._live is not None:  # its dispatch mode off: an in-process sweep's next run starts clean
            self._live.close()
        # Steps not gathered yet: kept with this rank's own figures (the other ranks may be gone, so no gather);
        # the unread rest is skipped once one cannot be read (e.g. after a CUDA error).
        try:
            self._finish_reads(trainer, pl_module, collective=False)
        except Exception:
            self._pending.clear()
            while self._read:
                self._ingest(trainer, *self._read.pop(0), collective=False)
        self.record_failure(trainer.global_rank, exception)

    def stopped(self, rank: int, signum: int) -> None:
        """The stop thread (flux_cp/runs/interrupt.py), in the reporting rank: the steps read so far as this rank's
        own (no gather: the other ranks are being ended; none to the logger: its service may be gone too), then the
        run recorded as interrupted, `complete: false`."""
        import signal

        from flux_cp.runs.failures import Terminated

        self._stopping = True
        self._remove_gc_hook()
        if self._trainer is not None:
            self._in_loop = False
            self._drain(self._trainer, self._module, float("inf"))  # the steps the device has finished: no wait
            while self._read:
                self._ingest(self._trainer, *self._read.pop(0), collective=False)
        name = signal.Signals(signum).name
        self.record_failure(rank, Terminated(name) if signum == signal.SIGTERM else KeyboardInterrupt(name))

    def record_failure(self, rank: int, exception: BaseException, at: float | None = None):
        """Any rank: its error (kind, failing shape) next to the steps measured so far, `complete: false`."""
        data = self.summary.header["config"]["data"]
        seq_len = data["image_height"] * data["image_width"] + data["text_tokens"]
        shape = {"seq_len": seq_len, "batch": data["batch_size"], "world": self.summary.header["world_size"]}
        self.summary.record_error(rank, error_line(exception), error_kind(exception), shape, at,
                                 trace=error_trace(exception))
