"""torchao's float8 training on the CPU (`make test-fp8` installs torchao for these tests alone; `-m fp8`): torch's
_scaled_mm runs on a CPU, so the FP8 paths of the full fine-tune are checked here (a run with --fp8 stays refused on a
CPU, so each test builds the step itself, --fp8 set past that check):
- torchao's Float8Linear on the blocks' token linears trains near bf16;
- FSDP2's float8 all-gather (--fsdp-fp8-all-gather: each weight cast on its shard, the scales from one all-reduce after
  each optimizer step) trains over two real gloo ranks exactly as FSDP2 without it, 10 steps."""

import os

import pytest
import torch

from .test_fp8 import train_steps, wide_config

pytestmark = pytest.mark.fp8


@pytest.fixture(autouse=True)
def _torchao():
    """`make test-fp8` installs torchao; the other sets deselect these tests (-m "not fp8"), so nothing skips there."""
    pytest.importorskip("torchao.float8")


STEPS = 10


def _with_cpu_scales(real):
    """torch._scaled_mm given its scales as flux_cp's own float8 GEMM gives them on a CPU (flux_cp/train/fp8.cpu_scales:
    torchao's tensor-wise scales run a reference kernel on some CPUs, which made this file's ranks time out)."""
    from flux_cp.train.fp8 import cpu_scales

    def scaled_mm(a, b, scale_a, scale_b, *args, **kwargs):
        return real(a, b, *cpu_scales(a, b, scale_a, scale_b), *args, **kwargs)

    return scaled_mm


@pytest.fixture(autouse=True)
def _fast_cpu_gemms(monkeypatch):
    monkeypatch.setattr(torch, "_scaled_mm", _with_cpu_scales(torch._scaled_mm))


def test_torchao_fp8_linears_train_near_bf16():
    """One process, the full fine-tune at Flux's learning rate (1e-4): tensorwise and rowwise FP8 (torchao's
    Float8Linear on every block token linear) stay within 0.1% of bf16's losses over 10 steps (measured: 4e-4 at
    most), and differ from them."""
    from torchao.float8.float8_linear import Float8Linear

    from flux_cp.train.fp8 import fp8_targets
    from flux_cp.train.step import build_model

    losses = {}
    for fp8 in ("none", "tensorwise", "rowwise"):
        cfg = wide_config("--lr", "1e-4", fp8=fp8)
        model = build_model(cfg).to(torch.bfloat16)
        converted = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
        assert converted == (sorted(fp8_targets(model)) if fp8 != "none" else [])
        losses[fp8] = train_steps(cfg, model, STEPS)
    ref = losses.pop("none")
    for fp8, got in losses.items():
        assert got != ref and all(abs(a - b) <= 1e-3 * b for a, b in zip(got, ref)), (fp8, got, ref)


def _fsdp_rank(rank: int, world: int, all_gather: bool, port: int, out, compiled: bool) -> None:
    """One of `world` gloo ranks: Flux's wide tiny model in FSDP2 over all of them, tensorwise FP8, STEPS steps;
    compiled: each block under torch.compile (aot_eager: AOTAutograd's tracing without inductor's codegen)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from flux_cp.parallel.mesh import shard_weights
    from flux_cp.train.step import build_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch._scaled_mm = _with_cpu_scales(torch._scaled_mm)  # a spawned process: the test's fixture did not run here
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = wide_config("--weights", "fsdp", "--devices", world, "--cp-degree", 1, "--data.global_batch", world,
                          fp8="tensorwise", fsdp_fp8_all_gather=all_gather, compile=compiled,
                          compile_backend="aot_eager")
        model = build_model(cfg).to(torch.bfloat16)
        shard_weights(model, init_device_mesh("cpu", (world,)), cfg.run)
        losses = train_steps(cfg, model, STEPS, rank, world)
        params = {n: p.full_tensor().float() for n, p in model.named_parameters()}  # every rank gathers
        local = type(model.double_blocks[0].ff.net[2].weight._local_tensor).__name__
        if rank == 0:
            torch.save({"losses": losses, "params": params, "local": local}, out)
    finally:
        dist.destroy_process_group()


def _fsdp(tmp_path, all_gather: bool, port: int, compiled: bool, world: int = 2) -> dict:
    import torch.multiprocessing as mp

    out = tmp_path / f"ag{int(all_gather)}.pt"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_fsdp_rank, args=(r, world, all_gather, port, out, compiled)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return torch.load(out)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fsdp_float8_all_gather_trains_as_fsdp_without_it_over_two_ranks(tmp_path, compiled):
    """Two gloo ranks, FSDP2, tensorwise FP8, 10 steps: with --fsdp-fp8-all-gather (each weight cast on its shard
    before the gather, its scale from the amax all-reduced over the shards) the same losses and final parameters, bit
    for bit, as the weights cast whole after the gather; and the weights are torchao's float8-gathering tensor.
    Compiled per block too: AOTAutograd refused the single blocks' aliased outputs there on the H200 (2026-12-07g)."""
    plain = _fsdp(tmp_path, False, 29561 + 2 * compiled, compiled)
    ag8 = _fsdp(tmp_path, True, 29562 + 2 * compiled, compiled)
    assert ag8["local"] == "WeightWithDynamicFloat8CastTensor" and plain["local"] != ag8["local"]
    assert ag8["losses"] == plain["losses"] and len(plain["losses"]) == STEPS
    assert ag8["params"].keys() == plain["params"].keys()
    assert all(torch.equal(ag8["params"][n], plain["params"][n]) for n in plain["params"])
    assert plain["losses"][-1] != plain["losses"][0]
