"""A simulated rank: this process is rank r of a W-rank job whose default process group is torch's fake
backend. Collectives complete at once and move nothing (receive buffers keep whatever memory they held),
so every line of the real code runs with a rank's real shapes: the DeviceMesh, the CP strategy (torch's
ring with its W chunks and merges, Ulysses' layouts, allgather-kv), DDP's reducer, ZeRO, FSDP2 and
Lightning's own strategy code. The step's compute is rank r's; its communication is what the ledger
(measure/ledger.py) records, priced afterwards by predict/step_model.py. torchtitan's dry runs use the same
backend (COMM_MODE=fake_backend). Values are not meaningful: summary.json says `"collectives": "fake"`.

    init_fake_world(8, rank=0)                       # before the Trainer
    Trainer(devices=1, plugins=[SimulatedEnvironment(8, 0)], strategy=DDPStrategy(...))   # flux_cp/train/strategies.py
"""

import torch
import torch.distributed as dist


def init_fake_world(world: int, rank: int = 0) -> None:
    """Make the default process group a fake one of `world` ranks, this process being `rank`."""
    # Importing the module registers the "fake" backend (torch 2.11 does not do it by itself) and its store.
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)


def is_fake() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_backend() == "fake"


def allreduce_hook(group, bucket) -> torch.futures.Future[torch.Tensor]:  # DDP checks this annotation
    """DDP's gradient all-reduce, as torch's default_hooks.allreduce_hook (average = sum / W, in the bucket),
    except that the future resolves to the bucket itself: the fake group's futures carry no tensor, which DDP's
    reducer rejects. Real and simulated ranks both use it, so both run the same code."""
    group = group if group is not None else dist.group.WORLD
    buf = bucket.buffer().div_(group.size())
    return dist.all_reduce(buf, group=group, async_op=True).get_future().then(lambda _: buf)

