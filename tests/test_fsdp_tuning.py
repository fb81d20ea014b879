"""FSDP2 as a team tunes it at depth (--fsdp-prefetch, --fsdp-reshard-last, --fsdp-reduce-dtype; parallel.mesh's
shard_weights): exact in fp64 against one process over 10 optimizer steps on real gloo ranks, in both harnesses and
with checkpointing; each setting visibly changes the collectives the ledger records (the same gathers issued ahead,
fewer all-gathers, wider reduce-scatters)."""

import json

import pytest

from .conftest import TINY, assert_exact, exact_run, main_in_process


@pytest.mark.parametrize("args", [
    ("--cp", "allgather-kv", "--fsdp-prefetch", 2, "--fsdp-reshard-last", 2),
    ("--cp", "ulysses", "--fsdp-prefetch", 1, "--fsdp-reshard-last", 4, "--checkpointing", "selective"),
    ("--cp", "allgather-kv", "--fsdp-prefetch", 3, "--fsdp-reshard-last", 1, "--harness", "bare"),
], ids=["agkv-pf2-rl2", "ulysses-pf1-rl4-selective", "agkv-pf3-rl1-bare"])
def test_tuned_fsdp_ranks_train_as_one_process(single_process, tmp_path, args):
    got = exact_run(tmp_path, "--devices", 2, "--weights", "fsdp", *args)
    run = got["summary"]["config"]["run"]
    assert run["weights"] == "fsdp" and run["fsdp_prefetch"] == args[3] and run["fsdp_reshard_last"] == args[5]
    assert_exact(got, single_process(1), rtol=1e-10)


def _collectives(tmp_path, name, *args) -> dict:
    out = tmp_path / name
    # plain data parallelism: every collective is FSDP's (a CP strategy's own would blur the counts)
    rc, lines = main_in_process("--config", TINY, "--simulate-world", 2, "--cp-degree", 1, "--data.global_batch", 2,
                                "--weights", "fsdp",
                                "--steps", 2, "--warmup-steps", 1, "--wandb-mode", "disabled", "--output", out,
                                "--regions-every", 1, *args)
    assert rc == 0, lines[-5:]
    return json.loads((out / "summary.json").read_text())["comm"]["per_step"]


def test_each_setting_changes_the_collectives_it_should(tmp_path):
    """The tiny model's 4 blocks + root: FSDP2 gathers each unit in the forward and each block again in the backward;
    blocks kept whole after the forward (--fsdp-reshard-last K) skip the second gather; explicit prefetch issues the
    same gathers, earlier; an fp32 reduce of bf16 gradients moves twice the bytes."""
    base = _collectives(tmp_path, "base", "--precision", "bf16-true")
    kept = _collectives(tmp_path, "kept", "--precision", "bf16-true", "--fsdp-reshard-last", 2)
    ahead = _collectives(tmp_path, "ahead", "--precision", "bf16-true", "--fsdp-prefetch", 2)
    wide = _collectives(tmp_path, "wide", "--precision", "bf16-true", "--fsdp-reduce-dtype", "fp32")
    assert kept["all_gather"]["count"] == base["all_gather"]["count"] - 2
    assert ahead["all_gather"] == base["all_gather"]
    assert wide["reduce_scatter"]["count"] == base["reduce_scatter"]["count"]
    assert wide["reduce_scatter"]["bytes"] == pytest.approx(2 * base["reduce_scatter"]["bytes"], rel=0.02)
    assert wide["all_gather"]["bytes"] == base["all_gather"]["bytes"]  # the parameters still travel in bf16


def test_prefetch_names_the_next_blocks_and_reshard_last_the_last_ones():
    """shard_weights' settings as FSDP2 holds them: block i prefetches blocks i+1..i+N in its forward and i-1..i-N in
    its backward; only the last K blocks keep their parameters after the forward."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from flux_cp.config import RunConfig, parse_config
    from flux_cp.model import FluxDiT
    from flux_cp.parallel.mesh import shard_weights

    from .conftest import free_port

    created = not dist.is_initialized()  # an in-process run of this worker may have left its group
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = FluxDiT(parse_config(["--config", str(TINY)], cuda_available=False).model).double()
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        shard_weights(model, mesh, RunConfig(fsdp_prefetch=2, fsdp_reshard_last=1))
        blocks = [*model.double_blocks, *model.single_blocks]
        state = [b._get_fsdp_state() for b in blocks]
        fwd = [[state.index(s) for s in st._states_to_forward_prefetch] for st in state]
        bwd = [[state.index(s) for s in st._states_to_backward_prefetch] for st in state]
        assert fwd == [[1, 2], [2, 3], [3], []] and bwd == [[], [0], [1, 0], [2, 1]]
        assert [b._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is None for b in blocks] == \
            [False, False, False, True]
        assert isinstance(model.proj_out.weight, torch.distributed.tensor.DTensor)
    finally:
        if created:
            dist.destroy_process_group()


@pytest.mark.parametrize("args", [
    ("--cp", "allgather-kv"),
    ("--cp", "ulysses", "--checkpointing", "full", "--harness", "bare"),
], ids=["agkv-lightning", "ulysses-full-bare"])
def test_cpu_offloaded_fsdp_ranks_train_as_one_process(single_process, tmp_path, args):
    """--fsdp-cpu-offload (FSDP2's CPUOffloadPolicy: shards, gradients and AdamW's state in host memory, AdamW stepping
    there): exact in fp64 against one process over 10 steps on real gloo ranks, in both harnesses. On a CPU the copies
    up and down are no-ops; the policy's plumbing (every unit offloaded, the optimizer over the host shards, Lightning
    leaving the shards where FSDP2 put them) is what runs."""
    got = exact_run(tmp_path, "--devices", 2, "--weights", "fsdp", "--fsdp-cpu-offload", "true", *args)
    assert got["summary"]["config"]["run"]["fsdp_cpu_offload"] is True
    assert got["summary"]["run_name"].split("-s")[0].endswith("-offload")
    assert_exact(got, single_process(1), rtol=1e-10)


def test_cpu_offload_puts_every_unit_under_fsdp2s_policy():
    """shard_weights with fsdp_cpu_offload: every block and the root offloaded (CPUOffloadPolicy, unpinned without
    CUDA); without it, none."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy

    from flux_cp.config import RunConfig, parse_config
    from flux_cp.model import FluxDiT
    from flux_cp.parallel.mesh import shard_weights

    from .conftest import free_port

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        for offload in (True, False):
            model = FluxDiT(parse_config(["--config", str(TINY)], cuda_available=False).model).double()
            shard_weights(model, init_device_mesh("cpu", (dist.get_world_size(),)), RunConfig(fsdp_cpu_offload=offload))
            units = [*model.double_blocks, *model.single_blocks, model]
            groups = [u._get_fsdp_state()._fsdp_param_group for u in units]
            assert [g.offload_policy.__class__ is CPUOffloadPolicy for g in groups] == [offload] * len(units)
            assert all(not p.offload_to_cpu or p.pin_memory is False for g in groups for p in g.fsdp_params)
    finally:
        if created:
            dist.destroy_process_group()

