"""LoRA (--lora-rank; flux_cp/lora.py, flux_cp/train/lora.py): every strategy trains the adapters exactly as one
process does (fp64, 10 optimizer steps on real gloo ranks: losses, first-step adapter gradients, final parameters)
and leaves the base weights bit-equal to their init; LoRA's FLOP count equals torch's own count of the tiny model's
training step; the adapted linears are those the model has."""

import pytest
import torch

from flux_cp.config import parse_config

from .conftest import TINY, assert_exact, exact_run

LORA = ("--lora-rank", 4, "--lora-alpha", 8)


@pytest.fixture(scope="module")
def lora_single(tmp_path_factory):
    """One process, LoRA on attention and MLPs: the reference of every distributed run below."""
    return exact_run(tmp_path_factory.mktemp("lora-single"), "--devices", 1, *LORA, "--lora-targets", "attention,mlp")


def _base_at_init() -> dict:
    from flux_cp.train.step import build_model

    cfg = parse_config(["--config", str(TINY)], cuda_available=False)
    return {n: p.detach().double() for n, p in build_model(cfg).named_parameters()}


def _assert_base_untouched(params: dict) -> None:
    init = _base_at_init()
    base = {n.replace(".base_layer", ""): p for n, p in params.items() if "lora_" not in n}
    assert base.keys() == init.keys()
    changed = [n for n in init if not torch.equal(base[n], init[n])]
    assert not changed, changed[:5]


def test_one_process_trains_only_the_adapters(lora_single):
    d, grads, params = lora_single["summary"], lora_single["grads"], lora_single["params"]
    assert d["lora"]["rank"] == 4 and d["lora"]["alpha"] == 8 and d["lora"]["modules"] == 22
    assert d["optimizer_params"] == d["lora"]["trainable_params"] == sum(p.numel() for n, p in params.items()
                                                                         if "lora_" in n)
    assert grads and all("lora_" in n for n in grads)  # the frozen base has no gradient
    assert any(g.abs().max() > 0 for n, g in grads.items() if "lora_B" in n)  # B trains from step 0 (A waits on B)
    assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in params.items() if "lora_B" in n)
    _assert_base_untouched(params)


@pytest.mark.parametrize("args", [
    ("--cp", "ulysses", "--weights", "ddp"),
    ("--cp", "allgather-kv", "--weights", "zero"),
    ("--cp", "ulysses", "--weights", "zero2"),
    ("--cp", "allgather-kv", "--weights", "fsdp", "--checkpointing", "selective"),
    ("--cp", "ulysses", "--weights", "fsdp", "--harness", "bare"),
], ids=["ulysses-ddp", "agkv-zero", "ulysses-zero2", "agkv-fsdp-selective", "ulysses-fsdp-bare"])
def test_ranks_train_the_adapters_as_one_process(lora_single, tmp_path, args):
    got = exact_run(tmp_path, "--devices", 2, *LORA, "--lora-targets", "attention,mlp", *args)
    assert got["summary"]["lora"]["trainable_params"] == lora_single["summary"]["lora"]["trainable_params"]
    assert_exact(got, lora_single, rtol=1e-10)
    _assert_base_untouched(got["params"])


def test_data_and_context_parallel_lora_trains_as_one_process_of_two_samples(tmp_path):
    """dp = 2 groups of cp = 2 ranks: two samples a step, as one process with batch 2."""
    ref = exact_run(tmp_path / "one", "--devices", 1, "--data.batch_size", 2, *LORA)
    got = exact_run(tmp_path / "four", "--devices", 4, "--cp-degree", 2, "--cp", "ulysses", *LORA)
    assert_exact(got, ref, rtol=1e-10)


@pytest.mark.parametrize("fuse", ["true", "false"])
@pytest.mark.parametrize("targets", ["attention", "attention,mlp", "mlp", "single_blocks.1.proj_out"])
def test_lora_flops_equal_torchs_count_of_a_training_step(targets, fuse):
    """torch's FlopCounterMode over one forward and backward of the tiny model with peft's adapters (attention by
    the math kernel, whose matmuls it counts) against lora_train_flops: within 2% (the count is exact: autograd skips
    the weight gradients of the frozen base and the input gradients where nothing upstream trains)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from flux_cp.measure.flops import lora_train_flops
    from flux_cp.model import image_ids, text_ids
    from flux_cp.train.step import build_model

    cfg = parse_config(["--config", str(TINY), "--model.fuse_qkv", fuse, "--lora-rank", "3", "--lora-targets",
                        targets], cuda_available=False)
    m, d, mc = build_model(cfg), cfg.data, cfg.model  # build_model applies LoRA
    assert any("lora_A" in n for n, _ in m.named_parameters())
    x, text = torch.randn(1, d.image_height * d.image_width, mc.in_channels), torch.randn(1, d.text_tokens, mc.text_dim)
    rope = m.rope(text_ids(d.text_tokens), image_ids(d.image_height, d.image_width))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        m(x, text, torch.randn(1, mc.pooled_dim), torch.rand(1), rope).pow(2).mean().backward()
    est = lora_train_flops(mc, d, targets, 3)["total"]
    assert est == pytest.approx(counter.get_total_flops(), rel=0.02)


@pytest.mark.parametrize("fuse", ["true", "false"])
def test_block_linears_are_the_models(fuse):
    """flux_cp/linears.py's table of the blocks' token linears (names, shapes) against a built model's."""
    from flux_cp.linears import block_linears
    from flux_cp.model import FluxDiT

    cfg = parse_config(["--config", str(TINY), "--model.fuse_qkv", fuse], cuda_available=False)
    with torch.device("meta"):
        m = FluxDiT(cfg.model)
    skip = {id(x) for x in m.conditioning_linears()}
    built = {(n, x.in_features, x.out_features) for n, x in m.named_modules()
             if isinstance(x, torch.nn.Linear) and id(x) not in skip and n.startswith(("double_", "single_"))}
    assert built == {(lin.name, lin.fan_in, lin.fan_out) for lin in block_linears(cfg.model)}


def test_a_lora_run_is_divided_only_by_a_lora_baseline(tmp_path, capsys, monkeypatch):
    """The closing line's W=1 baseline shares the run's LoRA settings: a LoRA W=2 rank finds the LoRA W=1 run, a full
    fine-tune W=2 rank beside it does not, and the next command it gives repeats the LoRA flags."""
    from .conftest import train_bench

    monkeypatch.chdir(tmp_path)  # the verdict also searches ./runs: a checkout's own runs (make bench) stay out

    def run(*args) -> list[str]:
        capsys.readouterr()
        assert train_bench().main(list(map(str, (*common, *args)))) == 0
        return capsys.readouterr().out.strip().splitlines()[-2:]  # the answer and the next command

    common = ("--config", TINY, "--steps", 2, "--warmup-steps", 1, "--wandb-mode", "disabled")
    lora = ("--lora-rank", 4, "--lora-targets", "attention,mlp")
    answer, nxt = run(*lora, "--simulate-world", 2, "--output", tmp_path / "w2-lora")
    assert "no W=1 baseline" in answer
    assert nxt.startswith("next: python scripts/train_bench.py --lora-rank 4 --lora-targets attention,mlp --devices 1")
    run(*lora, "--devices", 1, "--cp", "none", "--output", tmp_path / "w1-lora")
    answer, _ = run(*lora, "--simulate-world", 2, "--output", tmp_path / "w2-lora-again")
    assert f"{tmp_path / 'w1-lora'} (W=1)" in answer, answer  # divided by it (or, a two-step smoke, doubted)
    answer, _ = run("--simulate-world", 2, "--output", tmp_path / "w2-full")
    assert "no W=1 baseline" in answer, answer


@pytest.mark.peft
@pytest.mark.parametrize("targets", ["attention", "attention,mlp"])
def test_the_adapters_are_pefts(targets):
    """flux_cp's LoraLinear against peft's own LoRA (inject_adapter_in_model, the same LoraConfig) on the tiny model,
    fp64, from the same seed: the same parameter names, the same init (peft's RNG draws), the same trainable set, and
    bit-equal losses and gradients over a forward and backward."""
    peft = pytest.importorskip("peft")
    from flux_cp.model import FluxDiT, image_ids, text_ids
    from flux_cp.train.step import build_model

    cfg = parse_config(["--config", str(TINY), "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", targets],
                       cuda_available=False)
    ours = build_model(cfg).double()
    torch.manual_seed(cfg.data.seed)
    theirs = FluxDiT(cfg.model)
    from flux_cp.lora import lora_modules

    names = [lin.name for lin in lora_modules(cfg.model, targets)]
    peft.inject_adapter_in_model(peft.LoraConfig(r=4, lora_alpha=8, target_modules=names), theirs)
    theirs.double()
    a, b = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert a.keys() == b.keys()
    assert all(torch.equal(a[n], b[n]) and a[n].requires_grad == b[n].requires_grad for n in a)
    d, mc = cfg.data, cfg.model
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, d.image_height * d.image_width, mc.in_channels, generator=g, dtype=torch.float64)
    text = torch.randn(1, d.text_tokens, mc.text_dim, generator=g, dtype=torch.float64)
    pooled, t = torch.randn(1, mc.pooled_dim, generator=g, dtype=torch.float64), torch.rand(1, generator=g)
    rope = ours.rope(text_ids(d.text_tokens), image_ids(d.image_height, d.image_width), torch.float64)
    losses = []
    for m in (ours, theirs):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            loss = m(x, text, pooled, t.double(), rope).pow(2).mean()
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == losses[1]
    assert all(torch.equal(a[n].grad, b[n].grad) for n in a if a[n].requires_grad)


def test_the_reports_w1_references_of_a_lora_run_are_lora_runs():
    """The reconciliation's W=1 references (the user's step, the best W=1 step) come from runs of the same work: a
    faster full fine-tune W=1 step is not a LoRA run's reference, nor the other way round."""
    from pathlib import Path

    from flux_cp.report.reconcile import _w1_refs
    from flux_cp.report.runs import Config, Row, Run

    key = {"device": "H100", "heads": 24, "head_dim": 128, "mlp_ratio": 4.0, "blocks": "19+38", "seq_len": 4608,
           "batch": 1, "precision": "bf16-true", "harness": "bare", "compile": "off"}

    def config(lora: str, ms: float) -> Config:
        row = Row(1, Run(Path(f"/r/{lora}/summary.json"), {}), baseline=True, a={"step_ms": ms, "cp": "torch",
                                                                                   "run": f"w1-{lora}"})
        return Config(lora, key | {"lora": lora}, "torch", [row])

    configs = [config("off", 400.0), config("r64 attention", 520.0)]
    assert _w1_refs(configs, key | {"lora": "r64 attention"})["best"]["ms"] == 520.0
    assert _w1_refs(configs, key | {"lora": "off"})["user"]["ms"] == 400.0


def test_the_report_compares_lora_with_full_fine_tuning_only_when_asked(tmp_path, monkeypatch):
    """scripts/report.py groups a LoRA run apart from full fine-tuning (no W=1 baseline of its own here); with
    --across lora the two share a configuration and the LoRA rank is divided by the full W=1 step."""
    from flux_cp.report import build

    from .conftest import main_in_process

    monkeypatch.chdir(tmp_path)
    common = ("--config", TINY, "--steps", 3, "--warmup-steps", 1, "--wandb-mode", "disabled")
    assert main_in_process(*common, "--devices", 1, "--cp", "none", "--output", tmp_path / "runs" / "w1")[0] == 0
    assert main_in_process(*common, "--simulate-world", 2, "--cp", "allgather-kv", "--lora-rank", 4,
                           "--output", tmp_path / "runs" / "w2-lora")[0] == 0
    apart = build(tmp_path / "runs")
    lora = [c for c in apart.configs if c.key["lora"] != "off"]
    assert len(lora) == 1 and lora[0].baseline is None
    together = build(tmp_path / "runs", across=("lora",))
    (c,) = [c for c in together.configs if any(r.W == 2 for r in c.rows)]
    assert "lora" not in c.key and c.baseline.run.path.parent.name == "w1"


def test_fp8_converts_the_large_token_gemms_of_the_same_table():
    """--fp8's targets are the blocks' token linears of flux_cp/linears.py with K and N >= 1024: every one at Flux.1's
    dims (8 a double block, 3 a single one, fused q/k/v), none of the tiny model's (hidden 64), never the AdaLN
    modulations or the embedders."""
    from flux_cp.model import FluxDiT
    from flux_cp.train.fp8 import fp8_targets

    flux1 = parse_config(["--config", str(TINY.parent / "flux1.yaml")], cuda_available=True)
    with torch.device("meta"):
        m = FluxDiT(flux1.model)
    names = fp8_targets(m)
    assert len(names) == 8 * 19 + 3 * 38 and not any("norm" in n or "embed" in n for n in names)
    with torch.device("meta"):
        assert fp8_targets(FluxDiT(parse_config(["--config", str(TINY)], cuda_available=False).model)) == []


@pytest.mark.parametrize("args,backend", [
    (("--lora-rank", 8, "--precision", "bf16-true"), "flash"),  # torch's pick (cuDNN) failed under LoRA: flash
    (("--lora-rank", 8, "--precision", "bf16-true", "--sdpa-backend", "cudnn"), "cudnn"),  # named: as named
    (("--precision", "bf16-true"), "auto"),  # full fine-tuning: torch's pick
    (("--lora-rank", 8, "--precision", "bf16-true", "--cp", "torch"), "auto"),  # the ring pins flash under auto itself
    (("--lora-rank", 8, "--precision", "32-true", "--sdpa-backend", "efficient"), "efficient"),
])
def test_lora_on_a_gpu_pins_flash_where_torch_would_pick(args, backend):
    from flux_cp.checks import resolve

    cfg = parse_config(["--config", str(TINY), "--accelerator", "gpu", *map(str, args)], cuda_available=True)
    assert resolve(cfg, cuda_available=True, gpu_count=1).run.sdpa_backend == backend
