"""What a run leaves in its process that the next run in the same process (an in-process sweep, the planner) must
not inherit."""

def forget_process_groups() -> None:
    """After a run in a process that runs more (an in-process sweep, the planner): the process group destroyed and
    what torch keeps about its meshes forgotten. DeviceMesh caches its sub-meshes and DTensor its sharding decisions
    keyed by mesh layout, not by process group, so a later run whose (dp, cp) mesh has the same layout got the
    destroyed group's names back (seen on torch 2.11: "Could not resolve the process group registered under the
    name 3" in every run after a torch-ring run of the same mesh)."""
    import sys

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    try:
        from torch.distributed.device_mesh import _mesh_resources
    except ImportError:  # torch without DeviceMesh's environment object
        _mesh_resources = None
    for value in vars(_mesh_resources).values() if _mesh_resources is not None else ():
        if isinstance(value, (dict, list)):
            value.clear()
    if "torch.distributed.tensor" not in sys.modules:  # no DTensor yet: no sharding cache, and no 0.8 s import
        return
    try:
        from torch.distributed.tensor.debug import (
            _clear_fast_path_sharding_prop_cache,
            _clear_python_sharding_prop_cache,
        )
    except ImportError:  # older torch: the Python cache alone
        from torch.distributed.tensor.debug import _clear_python_sharding_prop_cache

        _clear_fast_path_sharding_prop_cache = None
    _clear_python_sharding_prop_cache()
    if _clear_fast_path_sharding_prop_cache is not None:
        _clear_fast_path_sharding_prop_cache()
