"""The LightningModule: one Flux training step under a CP strategy.

Manual optimization, so that the strategy's context (torch's context_parallel patches SDPA for
forward AND backward) wraps both passes of the step. Weights are replicated (DDP, optionally with
ZeRO-sharded optimizer state) or sharded (FSDP2) over all dp x cp ranks of the (dp, cp) mesh: see flux_cp.parallel.mesh.
"""

import json
import time
from pathlib import Path

import lightning as L
import torch

from flux_cp.config import BenchConfig
from flux_cp.data import DTYPES, device_batches, make_loader
from flux_cp.measure.ledger import OpRecorder, ledger_for
from flux_cp.measure.timing import StepTimer
from flux_cp.parallel.mesh import build_mesh, build_optimizer, full_grads, full_params, optimizer_numel, shard_weights
from flux_cp.parallel.tp import ignore_in_ddp, shard_model
from flux_cp.train.step import FluxStep, build_model


class _Batches:
    """Batches already on the device, as one iterable of known length."""

    def __init__(self, batches: list[dict]):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


class FluxCPModule(L.LightningModule):
    def __init__(self, cfg: BenchConfig):
        super().__init__()
        self.cfg = cfg
        self.automatic_optimization = False
        self.model = build_model(cfg)  # Lightning's precision plugin casts it, its strategy moves it if needed
        self.step = None  # FluxStep (the CP strategy, RoPE angles), set in on_fit_start once ranks are known
        self.mesh = None  # (dp, cp) DeviceMesh, set in configure_model
        self.timer = StepTimer(cuda=False, enabled=False)
        self.batch_marks: dict[str, float] = {}  # host clock around the batch's copy to the device, this step

    def train_dataloader(self):
        run = self.cfg.run
        n = run.warmup_steps + (run.profile_steps if run.profile else 0) + run.steps
        dp_rank = self.global_rank // run.cp_degree  # cp is the mesh's inner dim
        if run.loader == "device":  # made up front on the device: a batch is a list item, already in place
            # a plain iterable (Lightning takes any): a DataLoader's fetcher and collate cost host time per step. Not
            # the list itself, which Lightning would read as one loader per item.
            return _Batches(device_batches(self.cfg.data, self.cfg.model, n, dp_rank, run.dp, DTYPES[run.precision],
                                           self.trainer.strategy.root_device))
        return make_loader(self.cfg.data, self.cfg.model, n, dp_rank, run.dp, workers=run.num_workers,
                           pin=run.accelerator == "gpu", dtype=DTYPES[run.precision])

    def configure_model(self):
        if self.mesh is not None:  # Lightning may call this hook more than once
            return
        run = self.cfg.run
        device_type = self.trainer.strategy.root_device.type  # the module is still on CPU here
        self.mesh = build_mesh(device_type, run.dp, run.cp_degree)
        if run.cp == "tp" and self.mesh is not None:  # before Lightning's DDP and the optimizer see the parameters
            cp, dp = self.mesh["cp"], self.mesh["dp"]
            names = shard_model(self.model, cp.get_local_rank(), cp.size(), cp.get_group(),
                                dp.get_group() if run.dp > 1 else None, run.dp)  # dp x tp: across its groups
            ignore_in_ddp(self, names, "model.")
        if run.weights == "fsdp":  # all dp x cp ranks: Lightning's data_parallel dim (parallel.mesh.lightning_strategy)
            shard_weights(self.model, self.device_mesh["data_parallel"], run)

    def configure_optimizers(self):
        opt = build_optimizer(self.model, self.cfg.run, self.device)
        self.optimizer_params = optimizer_numel(opt)  # < all params under --weights zero (ZeRO-1)
        return opt

    def on_fit_start(self):
        run = self.cfg.run
        cp_mesh = self.mesh["cp"] if self.mesh is not None else None
        # Op regions would split a compiled graph (graph breaks change what is measured): off under --compile; a CUDA
        # graph's replay has no regions to time (--step-graph).
        self.timer = StepTimer(cuda=self.device.type == "cuda",
                               enabled=run.timing and not (run.compile or run.step_graph),
                               ledger=ledger_for(run))
        # Lightning's DDP wraps this module, not self.model: its way to a backward without the sync (accumulation)
        no_sync = getattr(self.trainer.strategy, "block_backward_sync", None)
        self.step = FluxStep(self.cfg, self.model, self.device, cp_mesh, self.timer, no_sync=no_sync)

    # Host clock stamps around Lightning's copy of the batch to the device (the timing callback's data_ms, transfer_ms)
    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.batch_marks = {"fetched": time.perf_counter()}
        return batch

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if self.cfg.run.loader == "device":  # already there: no walk over the batch's tensors
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.batch_marks["transferred"] = time.perf_counter()
        return batch

    def training_step(self, batch, batch_idx):
        if not (self.cfg.run.dump_ops and batch_idx == self.cfg.run.warmup_steps):
            return self._step(batch, batch_idx)
        with OpRecorder() as rec:  # --dump-ops: what this rank computes in its first measured step
            out = self._step(batch, batch_idx)
        path = Path(self.cfg.run.output) / f"ops_rank{self.global_rank}.json"
        path.write_text(json.dumps(rec.ops))
        return out

    def _step(self, batch, batch_idx):
        # the module itself: Lightning's DDP wrapper is around training_step already
        opt, replay = self.optimizers(), self.step.replays
        loss = self.step(self.model, opt, batch, backward=self.manual_backward)
        if replay:  # the replay stepped AdamW on the device: Lightning counts optimizer steps (global_step) on the host
            opt._on_before_step()  # the hooks Lightning's manual loop puts around LightningOptimizer.step
            opt._on_after_step()
        if self.cfg.run.dump_grads and batch_idx == 0:
            self._dump_grads()
        return {"loss": loss}

    def on_train_end(self):
        if self.step is not None:  # before Lightning's atexit destroy_process_group (flux_cp/train/step_graph.py: why)
            self.step.finish(self.optimizers().optimizer)
            self.step.close()
        if self.cfg.run.dump_params:
            self._save(full_params(self.model), "params_final.pt")  # every rank: gathering FSDP's shards

    def _dump_grads(self):
        self._save(full_grads(self.model), "grads_step0.pt")  # every rank: gathering FSDP's sharded grads

    def _save(self, tensors: dict[str, torch.Tensor], name: str) -> None:
        if self.global_rank != 0:
            return
        path = Path(self.cfg.run.output) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(tensors, path)
