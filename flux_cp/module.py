"""The LightningModule: one Flux training step under a CP strategy.

Manual optimization, so that the strategy's context (torch's context_parallel patches SDPA for
forward AND backward) wraps both passes of the step. Weights are replicated (DDP, optionally with
ZeRO-sharded optimizer state) or sharded (FSDP2) over all dp x cp ranks of the (dp, cp) mesh: see flux_cp.mesh.
"""

import json
import os
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

from flux_cp.config import BenchConfig
from flux_cp.data import DTYPES, make_loader
from flux_cp.ledger import CommLedger, OpRecorder
from flux_cp.mesh import build_mesh, build_optimizer, full_grads, full_params, optimizer_numel, shard_weights
from flux_cp.model import FluxDiT, image_ids, text_ids
from flux_cp.parallel import apply_cp, make_strategy, shard, split_conditioning
from flux_cp.timing import StepTimer


def init_device(accelerator: str) -> torch.device:
    """Where the weights are drawn: on the GPU the run trains on (LOCAL_RANK, set by Lightning's launcher and torchrun),
    since the CPU's serial RNG takes ~15 s per run for Flux.1-sized blocks; Lightning moves them on if needed."""
    if accelerator == "gpu" and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


class FluxCPModule(L.LightningModule):
    def __init__(self, cfg: BenchConfig):
        super().__init__()
        self.cfg = cfg
        self.automatic_optimization = False
        torch.manual_seed(cfg.data.seed)  # same random init at every world size and strategy (per device type)
        with torch.device(init_device(cfg.run.accelerator)):
            self.model = FluxDiT(cfg.model)
        self.strategy = None  # set in on_fit_start, once ranks and devices are known
        self.mesh = None  # (dp, cp) DeviceMesh, set in configure_model
        self.timer = StepTimer(cuda=False, enabled=False)
        self.batch_marks: dict[str, float] = {}  # host clock around the batch's copy to the device, this step

    def train_dataloader(self):
        run = self.cfg.run
        n = run.warmup_steps + (run.profile_steps if run.profile else 0) + run.steps
        dp_rank = self.global_rank // run.cp_degree  # cp is the mesh's inner dim
        return make_loader(self.cfg.data, self.cfg.model, n, dp_rank, run.dp, workers=run.num_workers,
                           pin=run.accelerator == "gpu", dtype=DTYPES[run.precision])

    def configure_model(self):
        if self.mesh is not None:  # Lightning may call this hook more than once
            return
        run = self.cfg.run
        device_type = self.trainer.strategy.root_device.type  # the module is still on CPU here
        self.mesh = build_mesh(device_type, run.dp, run.cp_degree)
        if run.weights == "fsdp":  # all dp x cp ranks: Lightning's data_parallel dim (flux_cp.mesh.lightning_strategy)
            shard_weights(self.model, self.device_mesh["data_parallel"])

    def configure_optimizers(self):
        opt = build_optimizer(self.model, self.cfg.run, self.device)
        self.optimizer_params = optimizer_numel(opt)  # < all params under --weights zero (ZeRO-1)
        return opt

    def on_fit_start(self):
        run, data = self.cfg.run, self.cfg.data
        cp_mesh = self.mesh["cp"] if self.mesh is not None else None
        rank, world = (cp_mesh.get_local_rank(), cp_mesh.size()) if cp_mesh is not None else (0, 1)  # in the CP group
        # Op regions would split a compiled graph (graph breaks change what is measured): off under --compile.
        self.timer = StepTimer(cuda=self.device.type == "cuda", enabled=run.timing and not run.compile,
                               ledger=CommLedger.get())
        self.strategy = make_strategy(run.cp, rank, world, self.device, run.sdpa_backend, run.rotate, mesh=cp_mesh)
        apply_cp(self.model, self.strategy, self.timer)
        if run.split_conditioning:
            split_conditioning(self.model, self.strategy)
        if run.compile:  # the attention processor (and its collectives) is traced with the blocks
            mode = run.compile_mode if run.compile_backend == "inductor" and run.compile_mode != "default" else None
            scope = [self.model] if run.compile_scope == "model" else [*self.model.double_blocks,
                                                                        *self.model.single_blocks]
            for m in scope:
                m.compile(mode=mode, backend=run.compile_backend)
        self.split = (rank, world)  # this rank's place in its CP group (a simulated rank's too: its fake group)
        # Each rank's RoPE angles: its own text and image tokens' positions, in [text, image] order.
        txt = shard(text_ids(data.text_tokens), 0, *self.split)
        img = shard(image_ids(data.image_height, data.image_width), 0, *self.split)
        dtype = torch.promote_types(DTYPES[run.precision], torch.float32)  # fp32 under bf16, fp64 in fp64 runs
        self.rope = self.model.rope(txt.to(self.device), img.to(self.device), dtype)  # (cos, sin), (S_l, head_dim)

    # Host clock stamps around Lightning's copy of the batch to the device (the timing callback's data_ms, transfer_ms)
    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.batch_marks = {"fetched": time.perf_counter()}
        return batch

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
        opt = self.optimizers()
        # Before the forward: FSDP2 leaves the root unit unsharded after it, where a model.zero_grad would clear the
        # unsharded copies and the sharded grads (AdamW's) would sum over steps. ZeRO's param_groups hold every param.
        opt.zero_grad(set_to_none=True)
        x, target, text = (shard(batch[k], 1, *self.split) for k in ("x_t", "target", "text"))  # (B, S/W, .)
        with self.strategy.step_context():
            pred = self.model(x, text, batch["pooled"], batch["t"], self.rope)
            # Mean over local image tokens of this rank's samples. Every rank holds the same number of tokens
            # (equal sequence shards of equally many samples), so the mean of the dp x cp local losses is the
            # global mean, and averaging gradients over all dp x cp ranks (DDP all-reduce, FSDP reduce-scatter)
            # gives the gradient of the global loss. In fp32 at least (bf16 runs), fp64 in fp64 runs.
            dtype = torch.promote_types(pred.dtype, torch.float32)
            loss = F.mse_loss(pred.to(dtype), target.to(dtype))
            self.timer.mark("forward_end")
            self.manual_backward(loss)
            self.timer.mark("backward_end")  # DDP's bucket all-reduces are consumed here (the reducer waits)
        opt.step()
        if self.cfg.run.dump_grads and batch_idx == 0:
            self._dump_grads()
        return {"loss": loss.detach()}

    def on_train_end(self):
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
