"""The strategy registry: `--cp` names to strategy objects. Its own module so that cp.py and tp.py (which builds on
cp.py) import one way.

    strategy = make_strategy("allgather-kv", cp_rank, cp, device, mesh=mesh["cp"])
"""

from flux_cp.parallel.cp import AllGatherKV, CPStrategy, TorchRing, Ulysses
from flux_cp.parallel.tp import TensorParallel

STRATEGY_CLASSES = {c.name: c for c in (CPStrategy, AllGatherKV, Ulysses, TorchRing)}


def make_strategy(name: str, rank: int, world: int, device, sdpa_backend="auto", rotate="allgather",
                  mesh=None, ulysses_qkv="fused") -> CPStrategy:
    """rank, world: within the CP group, whose 1-D DeviceMesh is `mesh` (parallel.mesh.build_mesh(...)["cp"])."""
    kwargs = {"rotate": rotate} if name == "torch" else {"qkv": ulysses_qkv} if name == "ulysses" else {}
    if name == "tp":
        return TensorParallel(rank, world, device, sdpa_backend=sdpa_backend, mesh=mesh)
    return STRATEGY_CLASSES[name](rank, world, device, sdpa_backend=sdpa_backend, mesh=mesh, **kwargs)
