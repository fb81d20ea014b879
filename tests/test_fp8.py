"""FP8 under LoRA (--fp8 with --lora-rank; flux_cp/train/fp8.py's FrozenFloat8Linear): the frozen base's GEMMs in
float8 on a weight cast once. torch's _scaled_mm runs on a CPU, so its numerics are checked here: the forward and the
input's gradient equal the same GEMMs on the dequantized float8 operands (fp32: exactly), a bf16 LoRA model with it
trains its adapters near the bf16 one and leaves the base bit-equal. A run with --fp8 stays refused on a CPU
(tests/test_bad_input.py); its loss against bf16 over 50 steps on a GPU is tests/test_gpu_depth.py's."""

import re

import pytest
import torch

from flux_cp.config import parse_config

from .conftest import TINY

# Tiny's structure at hidden 1024 (16 heads x 64), one block of each kind: every block linear is an FP8 target
WIDE = ("--model.num_heads", "16", "--model.head_dim", "64", "--model.rope_axes", "[16, 24, 24]",
        "--model.double_blocks", "1", "--model.single_blocks", "1", "--precision", "bf16-true")


def _frozen(recipe, dtype, bias=True):
    from flux_cp.train.fp8 import FrozenFloat8Linear

    torch.manual_seed(0)
    base = torch.nn.Linear(1024, 2048, bias=bias).to(dtype).requires_grad_(False)
    m = FrozenFloat8Linear.from_linear(base, recipe)
    m.cache()
    return base, m


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_frozen_fp8_linear_is_the_gemm_of_its_float8_operands(recipe):
    """fp32 activations: y and dx equal fp32 GEMMs of the dequantized float8 tensors (the same casts, torchao's
    dtypes: e4m3, gradients e5m2 under tensorwise); the base weight has no gradient; y is the bf16-free linear's
    within float8's rounding (~4%)."""
    from flux_cp.train.fp8 import E4M3, E5M2, to_float8

    base, m = _frozen(recipe, torch.float32)
    rowwise = recipe == "rowwise"
    x = torch.randn(3, 50, 1024, requires_grad=True)
    y = m(x)
    g = torch.randn_like(y)
    y.backward(g)
    x8, x_inv = to_float8(x.detach().reshape(-1, 1024), E4M3, rowwise)
    w = m.w8.float() * m.w_inv.reshape(-1, 1)  # (N, K)
    ref = (x8.float() * x_inv) @ w.t() + base.bias
    torch.testing.assert_close(y.reshape(-1, 2048), ref, rtol=1e-6, atol=1e-5)
    g8, g_inv = to_float8(g.reshape(-1, 2048), E4M3 if rowwise else E5M2, rowwise)
    wt = m.w8t.float() * m.wt_inv.reshape(-1, 1)  # (K, N)
    torch.testing.assert_close(x.grad.reshape(-1, 1024), (g8.float() * g_inv) @ wt.t(), rtol=1e-6, atol=1e-5)
    assert base.weight.grad is None and m.weight is base.weight
    exact = x.detach() @ base.weight.t() + base.bias
    assert 0 < ((y - exact).norm() / exact.norm()).item() < 0.06
    if rowwise:  # a power-of-2 scale a row, as torchao's rowwise recipe
        assert m.w_inv.shape == (1, 2048) and m.wt_inv.shape == (1, 1024)
        assert torch.equal(m.w_inv, torch.exp2(torch.round(torch.log2(m.w_inv))))


def test_frozen_fp8_linear_needs_its_weight_frozen_and_cached():
    from flux_cp.train.fp8 import FrozenFloat8Linear

    trained = FrozenFloat8Linear.from_linear(torch.nn.Linear(1024, 1024), "tensorwise")
    with pytest.raises(RuntimeError, match="must be frozen"):
        trained.cache()
    uncached = FrozenFloat8Linear.from_linear(torch.nn.Linear(1024, 1024).requires_grad_(False), "tensorwise")
    with pytest.raises(RuntimeError, match="not cached"):
        uncached(torch.randn(4, 1024))


def wide_config(*args, **run):
    """The resolved CPU config of WIDE with `args`, then `run`'s settings set past the checks (--fp8: refused on a
    CPU)."""
    from flux_cp.checks import resolve

    cfg = resolve(parse_config(["--config", str(TINY), *WIDE, *map(str, args)], cuda_available=False),
                  cuda_available=False, gpu_count=0)
    for k, v in run.items():
        setattr(cfg.run, k, v)
    return cfg


def train_steps(cfg, model, steps: int, rank: int = 0, world: int = 1) -> list[float]:
    """`steps` AdamW steps through FluxStep itself on the CPU; each step's loss, the mean over the ranks."""
    import torch.distributed as dist

    from flux_cp.data import device_batches
    from flux_cp.measure.timing import StepTimer
    from flux_cp.parallel.mesh import build_optimizer
    from flux_cp.train.step import FluxStep

    cpu = torch.device("cpu")
    opt = build_optimizer(model, cfg.run, cpu)
    step = FluxStep(cfg, model, cpu, None, StepTimer(cuda=False, enabled=False, ledger=None))
    losses = []
    for batch in device_batches(cfg.data, cfg.model, steps, rank, world, torch.bfloat16, cpu):
        loss = step(model, opt, batch).detach()
        if world > 1:
            dist.all_reduce(loss)
        losses.append(loss.item() / world)
    return losses


def _lora_model(fp8: str, **run):
    """A LoRA run's config (rank 8 on attention, --fp8 set past its CPU check) and its model in bf16."""
    from flux_cp.train.step import build_model

    cfg = wide_config("--lora-rank", 8, "--lora-targets", "attention", fp8=fp8, **run)
    return cfg, build_model(cfg).to(torch.bfloat16)


def test_lora_fp8_converts_every_frozen_target_and_keeps_the_names():
    """Every FP8 target is a FrozenFloat8Linear: the adapted ones under their adapters (base_layer), the others in
    place; the adapters, the modulations and the embedders stay bf16 linears; the parameters are the same tensors
    by the same names as LoRA without FP8 (a checkpoint loads either way); no torchao is needed."""
    from flux_cp.train.fp8 import FrozenFloat8Linear, cache_frozen_fp8, fp8_targets

    _, plain = _lora_model("none")
    _, m = _lora_model("tensorwise")
    frozen = {n for n, mod in m.named_modules() if isinstance(mod, FrozenFloat8Linear)}
    targets = fp8_targets(m)
    assert len(targets) == 8 + 3  # fused q/k/v: 8 a double block, 3 a single one
    adapted = {n for n, mod in m.named_modules() if hasattr(mod, "lora_A")}
    assert frozen == {n + ".base_layer" if n in adapted else n for n in targets}
    assert adapted and all(not isinstance(m.get_submodule(n).lora_A["default"], FrozenFloat8Linear) for n in adapted)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in plain.named_parameters()]
    for (n, p), q in zip(m.named_parameters(), plain.parameters()):
        assert torch.equal(p, q) and p.requires_grad == q.requires_grad == ("lora_" in n), n
    assert cache_frozen_fp8(m) == len(frozen)


@pytest.fixture(scope="module")
def rowwise_none():
    """LoRA with its base in float8, rowwise: 10 steps, shared by the tests below."""
    return _train("rowwise", 10)


def test_lora_fp8_trains_the_adapters_near_bf16_and_leaves_the_base(rowwise_none):
    """10 AdamW steps of the same init and batches in bf16, LoRA with and without the float8 base, each recipe: the
    losses differ from bf16's, by 0.1% at most (measured: 1e-4), the adapters trained, every base weight bit-equal
    (the frozen parameters of each run against a fresh build)."""
    _, init = _lora_model("none")
    init = dict(init.named_parameters())
    ref = _train("none", 10)[0]
    for got, params in (_train("tensorwise", 10), rowwise_none):
        assert got != ref and all(abs(a - b) <= 1e-3 * b for a, b in zip(got, ref)), (got, ref)
        assert params.keys() == init.keys()
        assert all(torch.equal(p, init[n]) != ("lora_" in n) for n, p in params.items())  # adapters moved, base not


def _train(fp8: str, steps: int, **run) -> tuple[list[float], dict]:
    """`steps` steps of the LoRA model: losses, parameters."""
    cfg, model = _lora_model(fp8, **run)
    return train_steps(cfg, model, steps), {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", ["selective", "full"])
def test_lora_fp8_under_checkpointing_is_bit_equal_to_none(rowwise_none, checkpointing):
    """The float8 base recomputed in the backward (full), or its GEMMs saved and the casts recomputed (selective: the
    policy saves _scaled_mm's outputs): over 10 steps the same losses and adapters, bit for bit (the CPU recomputes
    deterministically)."""
    ref = rowwise_none
    got = _train("rowwise", 10, checkpointing=checkpointing)
    assert got[0] == ref[0] and got[1].keys() == ref[1].keys()
    assert all(torch.equal(got[1][n], ref[1][n]) for n in ref[1])


@pytest.mark.parametrize("args,error", [
    (("--lora-rank", 8, "--weights", "ddp"), None),
    (("--lora-rank", 8, "--weights", "zero2"), None),
    (("--lora-rank", 8, "--weights", "fsdp"),
     "--lora-rank with --fp8 tensorwise under --weights fsdp: the frozen base is cast to float8 once"),
    (("--cp", "ulysses", "--ulysses-overlap", "true"),
     "--fp8 tensorwise with --ulysses-overlap true: the overlap splits proj_out's weight"),
    (("--weights", "fsdp", "--fsdp-fp8-all-gather", "true"), None),
    (("--weights", "ddp", "--fsdp-fp8-all-gather", "true"),
     "--fsdp-fp8-all-gather true: gathers the float8 linears' weights in float8 under FSDP2, one scale a tensor: "
     "needs --fp8 tensorwise --weights fsdp without LoRA (not --fp8 tensorwise --weights ddp; or drop it)"),
    (("--weights", "fsdp", "--fsdp-fp8-all-gather", "true", "--lora-rank", 8),
     "--fsdp-fp8-all-gather true: gathers the float8 linears' weights in float8 under FSDP2, one scale a tensor: "
     "needs --fp8 tensorwise --weights fsdp without LoRA (not --fp8 tensorwise --weights fsdp --lora-rank 8; or drop "
     "it)"),
], ids=["lora-ddp", "lora-zero2", "lora-fsdp", "ulysses-overlap", "fsdp-all-gather", "ddp-all-gather",
        "lora-fsdp-all-gather"])
def test_fp8_on_a_gpu_resolves_under_lora_without_torchao_but_not_where_it_would_not_apply(args, error):
    """A GPU's settings (checked here without one): LoRA's float8 base needs no torchao, but not under FSDP; the
    Ulysses overlap would multiply by proj_out's bf16 weight itself, so FP8 is refused with it (LoRA or not); FSDP's
    float8 all-gather takes tensorwise FP8 of trained weights under FSDP alone."""
    from flux_cp.checks import check_installed, resolve
    from flux_cp.config import ConfigError

    gpu = ("--accelerator", "gpu", "--precision", "bf16-true", "--fp8", "tensorwise", "--devices", "2")
    cfg = parse_config(["--config", str(TINY), *gpu, *map(str, args)], cuda_available=True)
    if error is None:
        run = resolve(cfg, cuda_available=True, gpu_count=2).run
        if run.lora_rank:
            check_installed(run)  # no torchao here: ours needs none
        return
    with pytest.raises(ConfigError, match=re.escape(error)):
        resolve(cfg, cuda_available=True, gpu_count=2)


def test_the_planner_prices_lora_fp8_with_its_float8_copies_and_prunes_it_under_fsdp():
    """Flux.1 LoRA at B = W = 8: the DDP plan with its base in float8 carries a byte a weight twice more of every
    converted linear (W and W^T; its activations as LoRA's); under FSDP it is left out with the check's reason."""
    from flux_cp.plan.plans import enumerate_plans
    from flux_cp.train.fp8 import fp8_linears

    cfg = parse_config(["--config", str(TINY.parent / "flux1_lora.yaml")], cuda_available=True)
    plans = {(p.weights, p.fp8): p for p in enumerate_plans(cfg, seq_len=4608, global_batch=8, world=8, cps=("none",),
                                                            weights=("ddp", "fsdp"), memory_gib_limit=80,
                                                            fp8=("none", "tensorwise"))}
    copies = 2 * sum(lin.fan_in * lin.fan_out for lin in fp8_linears(cfg.model)) / 2**30
    assert 15 < copies < 17  # 8.6 B of Flux.1's 11.9 B weights (most of the rest: the AdaLN modulations)
    ddp, fp8 = plans["ddp", "none"], plans["ddp", "tensorwise"]
    assert fp8.pruned is None and fp8.name == "dp8-ddp-eager-fp8tensorwise"
    assert fp8.memory_gib == pytest.approx(ddp.memory_gib + copies, rel=1e-12)
    assert plans["fsdp", "tensorwise"].pruned.startswith("--lora-rank with --fp8 tensorwise under --weights fsdp")


def test_fsdp_fp8_all_gather_keeps_the_last_blocks_weights_in_float8():
    """--fsdp-reshard-last 57 with --fsdp-fp8-all-gather: the blocks kept whole from forward to backward hold their
    float8 linears' weights in a byte each, so the estimate drops by a byte a weight of every converted linear."""
    from flux_cp.checks import resolve
    from flux_cp.plan.plans import Plan, count_params, memory_gib
    from flux_cp.train.fp8 import fp8_linears

    def gib(*args):
        cfg = resolve(parse_config(["--config", str(TINY.parent / "flux1.yaml"), "--accelerator", "gpu",
                                    "--simulate-world", "8", "--cp-degree", "1", "--weights", "fsdp", "--fp8",
                                    "tensorwise", "--fsdp-reshard-last", "57", *args], cuda_available=True),
                      cuda_available=True, gpu_count=1)
        return cfg, memory_gib(cfg, count_params(cfg), Plan(8, 1, "none", "fsdp", "compiled", fp8="tensorwise"))

    cfg, plain = gib()
    _, gathered = gib("--fsdp-fp8-all-gather", "true")
    converted = sum(lin.fan_in * lin.fan_out for lin in fp8_linears(cfg.model))
    assert plain - gathered == pytest.approx(converted * 7 / 8 / 2**30, rel=1e-12) and 7 < plain - gathered < 8


def test_the_planners_fp8_axis_has_fsdps_float8_all_gather():
    """--fp8 tensorwise-ag8: tensorwise with FSDP's float8 all-gather, a plan of its own under FSDP (named -ag8, its
    setting in the run's), left out with the check's reason under DDP."""
    from flux_cp.plan.plans import enumerate_plans

    cfg = parse_config(["--config", str(TINY.parent / "flux1.yaml")], cuda_available=True)
    plans = {(p.weights, p.fp8): p for p in enumerate_plans(cfg, seq_len=4608, global_batch=8, world=8, cps=("none",),
                                                            weights=("ddp", "fsdp"), builds=("compiled",),
                                                            memory_gib_limit=80, fp8=("tensorwise", "tensorwise-ag8"))}
    ag8 = plans["fsdp", "tensorwise-ag8"]
    assert ag8.pruned is None and ag8.name == "dp8-fsdp-compiled-fp8tensorwise-ag8"
    assert ag8.settings["fp8"] == "tensorwise" and ag8.settings["fsdp_fp8_all_gather"] is True
    assert "fsdp_fp8_all_gather" not in plans["fsdp", "tensorwise"].settings
    assert plans["ddp", "tensorwise-ag8"].pruned.startswith("--fsdp-fp8-all-gather true: gathers the float8")
