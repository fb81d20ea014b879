"""Lightning's strategies for the (dp, cp) mesh of parallel/mesh.py: DDP with the project's comm hook, FSDP2 through
ModelParallelStrategy, one device; each able to run as a simulated rank and to end without moving the model off
the device."""

import torch
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

from flux_cp.config import DDP_WEIGHTS
from flux_cp.parallel.fake_group import allreduce_hook, is_fake


class SimulatedEnvironment(ClusterEnvironment):
    """Lightning's view of a simulated rank: a W-rank job of which this process (started by the user, not by
    Lightning) is global rank r, on local device 0. Lightning then runs its real DDP / ModelParallel strategy
    code; it finds the process group made already and keeps it."""

    def __init__(self, world: int, rank: int):
        self._world, self._rank = world, rank

    @property
    def creates_processes_externally(self) -> bool:
        return True  # Lightning must not launch the other W - 1 ranks

    @property
    def main_address(self) -> str:
        return "127.0.0.1"

    @property
    def main_port(self) -> int:
        return 0

    @staticmethod
    def detect() -> bool:
        return False

    def world_size(self) -> int:
        return self._world

    def set_world_size(self, size: int) -> None:
        pass  # Lightning sets devices x nodes (1): the simulated job's size stays W

    def global_rank(self) -> int:
        return self._rank

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return 0


class _KeepOnDevice:
    """Lightning's Strategy.teardown moves the model and the optimizer state to the CPU, for a later use a benchmark
    never has: ~8 s of a Flux run's wall time on an H200 (py-spy: _optimizers_to_device, module.cpu). They stay."""

    def teardown(self) -> None:
        self.optimizers = []
        module = self.lightning_module
        if module is not None:
            module.cpu = lambda: module  # this object's teardown only: an instance attribute, removed below
        try:
            super().teardown()
        finally:
            if module is not None:
                del module.cpu


class _Simulable:
    """What Lightning's strategies need to run a simulated rank (flux_cp.parallel.fake_group) unchanged:
    - Python objects (log dirs, ...) are broadcast from rank 0 with broadcast_object_list; over the fake group a
      rank r != 0 would receive garbage sizes and allocate them. A simulated job's ranks all hold what rank 0
      holds (one config, one folder), so under the fake group the object is this rank's own.
    - A simulated rank r is the job's one process: it logs and prints as rank 0 would (rank_zero_only)."""

    def broadcast(self, obj, src: int = 0):
        return obj if is_fake() else super().broadcast(obj, src)

    def set_world_ranks(self) -> None:
        super().set_world_ranks()
        if is_fake():
            from lightning.pytorch.utilities.rank_zero import rank_zero_only
            from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

            rank_zero_only.rank = utils_rank_zero_only.rank = 0


class ModelParallel(_KeepOnDevice, _Simulable, ModelParallelStrategy):
    """Lightning's FSDP2 strategy; with --fsdp-cpu-offload the model stays where FSDP2 put it: the shards in host
    memory (CPUOffloadPolicy refuses parameters moved to the GPU), its buffers already on the GPU."""

    def __init__(self, *args, cpu_offload: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._cpu_offload = cpu_offload

    def model_to_device(self) -> None:
        if not self._cpu_offload:
            super().model_to_device()


class DDPWithHook(_KeepOnDevice, _Simulable, DDPStrategy):
    """Lightning's DDPStrategy with DDP's gradient all-reduce as a comm hook (parallel.fake_group.allreduce_hook:
    torch's allreduce_hook with a future the fake group can complete), so real and simulated ranks run one code.
    Lightning registers comm hooks on CUDA only; this one runs on gloo and on the fake group too."""

    def __init__(self, *args, step_graph: bool = False, **kwargs):
        super().__init__(*args, **kwargs)  # Lightning builds DDP on a side stream already, as a capture needs
        self._step_graph = step_graph

    def _register_ddp_hooks(self) -> None:
        self.model.register_comm_hook(None, allreduce_hook)
        if self._step_graph:
            # DDP's forward still runs around each replay here (Lightning redirects training_step through it); its
            # runtime logger would read CUDA events of a backward the replays never run every 100th iteration
            self.model._set_ddp_runtime_logging_sample_rate(2**31 - 1)


class SingleDevice(_KeepOnDevice, SingleDeviceStrategy):
    pass


def lightning_strategy(run):
    """The Lightning strategy for `run.weights`.

    fsdp: Lightning's ModelParallelStrategy, with all dp x cp ranks mapped onto its `data_parallel` dim
    (tensor_parallel = 1). Its mesh dim is then exactly the flattened (dp, cp) mesh FSDP2 shards over, and
    the strategy already does what FSDP2 needs (configure_model before the optimizer, no DDP wrapper), so no
    subclass is needed; the (dp, cp) view that CP groups and data use is built by build_mesh on the same ranks.
    zero2: the same strategy for what it gives (a process group, no DDP wrapper, the optimizer built after the
    precision cast): flux_cp.parallel.zero2's optimizer syncs the gradients and parameters itself.
    """
    import datetime

    backend = "nccl" if run.accelerator == "gpu" else "gloo"
    timeout = datetime.timedelta(seconds=run.timeout_s)  # a collective that never matches fails the run
    if run.simulate_world:  # the fake group exists already (flux_cp.parallel.fake_group); Lightning keeps it
        backend = "fake"
    if run.weights not in DDP_WEIGHTS:  # no DDP wrapper; a process group even at world size 1
        return ModelParallel(data_parallel_size=run.world_size, tensor_parallel_size=1,
                             process_group_backend=backend, timeout=timeout, cpu_offload=run.fsdp_cpu_offload)
    # torch's CP needs a process group (its device mesh) even at world size 1
    if run.world_size > 1 or run.cp == "torch":
        return DDPWithHook(process_group_backend=backend, timeout=timeout, step_graph=run.step_graph,
                           gradient_as_bucket_view=run.grad_bucket_view)
    return SingleDevice(device=torch.device("cuda", 0) if run.accelerator == "gpu" else torch.device("cpu"))


def lightning_precision(run) -> dict:
    """The Trainer's precision arguments. Lightning's ModelParallelStrategy accepts precisions from a list of names
    without 64-true, though its DoublePrecision plugin works as bf16-true's HalfPrecision does there (module.to(dtype)
    after configure_model's fully_shard; default dtype in init and forward): under fsdp it is given as a plugin."""
    if run.weights not in DDP_WEIGHTS and run.precision == "64-true":
        from lightning.pytorch.plugins import DoublePrecision

        return {"precision": None, "plugins": [DoublePrecision()]}
    return {"precision": run.precision}
