"""Model FLOPs (flux_cp/measure/flops.py) against an independent count: torch's FlopCounterMode over the real model's
forward and backward, with SDPA computed as explicit matmuls so that its FLOPs are counted on CPU too (the CPU SDPA
kernel is invisible to the counter); throughput and MFU from a step time."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from flux_cp.config import parse_config
from flux_cp.data import make_batch
from flux_cp.measure.flops import model_flops, peak_flops, throughput
from flux_cp.model import FluxDiT, image_ids, text_ids

from .conftest import TINY


class _MatmulAttention(TorchFunctionMode):
    """F.scaled_dot_product_attention as Q K^T, softmax, P V: the matmuls FlopCounterMode counts."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = [*args, *(kwargs[n] for n in ("query", "key", "value") if n in kwargs)][:3]
            p = torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)  # (B, H, S, S)
            return p @ v  # (B, H, S, D)
        return func(*args, **kwargs)


def _counted(cfg, backward: bool) -> int:
    torch.manual_seed(0)
    model = FluxDiT(cfg.model)
    b = make_batch(cfg.data, cfg.model, 0)
    rope = model.rope(text_ids(cfg.data.text_tokens), image_ids(cfg.data.image_height, cfg.data.image_width))
    with FlopCounterMode(display=False) as fc, _MatmulAttention():
        pred = model(b["x_t"], b["text"], b["pooled"], b["t"], rope)
        if backward:
            pred.float().pow(2).mean().backward()
    return fc.get_total_flops()


@pytest.mark.parametrize("overrides", [[], ["--model.mlp_ratio", "2", "--data.text_tokens", "16"],
                                       ["--model.double_blocks", "1", "--model.single_blocks", "3"]])
def test_forward_flops_equal_an_independent_count(overrides):
    cfg = parse_config(["--config", str(TINY), *overrides], cuda_available=False)
    counted = _counted(cfg, backward=False)
    assert model_flops(cfg.model, cfg.data)["total"] == pytest.approx(counted, rel=0.02)


def test_a_training_step_is_three_forwards():
    """Backward = 2 x forward, but for the input gradients nobody asks for (the embedders' inputs are data)."""
    cfg = parse_config(["--config", str(TINY)], cuda_available=False)
    assert 3 * model_flops(cfg.model, cfg.data)["total"] == pytest.approx(_counted(cfg, backward=True), rel=0.02)


def test_attention_grows_with_the_square_of_the_sequence():
    cfg = parse_config(["--config", str(TINY)], cuda_available=False)
    a, b = (model_flops(cfg.model, cfg.data, seq_len=s) for s in (1024, 2048))
    assert b["attention"] == 4 * a["attention"] and b["gemm"] < 2.01 * a["gemm"]


def test_flux_dims_match_the_weights_of_the_real_model():
    """Flux.1's 19 + 38 blocks at 4608 tokens (built on the meta device: no memory): every Linear costs its weight's
    size in multiply-adds for each token it sees (a double block's text-stream weights see the text tokens, its image
    weights the image tokens, a single block's all of them); the AdaLN modulations, a quarter of the 12 B
    parameters, run once a sample. Attention is 4 S^2 d a block."""
    cfg = parse_config(["--config", "configs/flux_4608.yaml", "--model.double_blocks", "19",
                        "--model.single_blocks", "38"], cuda_available=False)
    St, S = cfg.data.text_tokens, cfg.data.seq_len
    with torch.device("meta"):
        model = FluxDiT(cfg.model)
    per_sample = {id(m) for m in model.conditioning_linears()} | {id(m) for m in model.time_text_embed.modules()}

    def tokens(name: str) -> int:
        if name.startswith("single_blocks"):
            return S
        text = name.startswith("context_embedder") or (name.startswith("double_blocks") and
                                                        any(k in name for k in ("context", "add")))
        return St if text else S - St

    macs = sum(m.weight.numel() * tokens(n) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and id(m) not in per_sample)
    assert 11.5e9 < sum(p.numel() for p in model.parameters()) < 12.5e9
    f = model_flops(cfg.model, cfg.data)
    assert f["attention"] == 57 * 4 * S * S * cfg.model.hidden
    assert f["gemm"] == pytest.approx(2 * macs, rel=0.01)


def test_throughput_and_mfu_from_a_step():
    peak, src = peak_flops("NVIDIA H200")
    assert peak == 989e12 and "dense" in src
    assert peak_flops("NVIDIA H100 80GB HBM3")[0] == 989e12 and peak_flops("NVIDIA H100 PCIe")[0] == 756e12
    assert peak_flops("cpu")[0] is None and peak_flops("NVIDIA H200", "32-true")[0] is None
    t = throughput(step_ms=100.0, world=4, samples=8, seq_len=4608, fwd_flops=1e12, peak=989e12)
    assert t["throughput/items_per_sec"] == pytest.approx(8 * 4608 / 0.1)
    assert t["throughput/device/items_per_sec"] == pytest.approx(8 * 4608 / 0.1 / 4)
    assert t["throughput/device/mfu"] == pytest.approx(3e12 * 8 / 0.1 / 4 / 989e12)
    assert "throughput/device/mfu" not in throughput(100.0, 1, 1, 10, 1.0, None)


@pytest.mark.gpu
def test_attention_flops_equal_the_counters_on_the_gpu():
    """On CUDA the counter sees SDPA's own kernels (flash / efficient / cuDNN): the whole forward, attention included,
    equals the count from the shapes, no matmul substitution needed (bf16, Flux's head size, 4608 tokens)."""
    cfg = parse_config(["--config", "configs/flux_4608.yaml", "--model.double_blocks", "1", "--model.single_blocks",
                        "1"], cuda_available=True)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = FluxDiT(cfg.model).to(torch.bfloat16)
    b = {k: v.cuda() for k, v in make_batch(cfg.data, cfg.model, 0).items()}
    rope = model.rope(text_ids(cfg.data.text_tokens).cuda(), image_ids(cfg.data.image_height,
                                                                       cfg.data.image_width).cuda())
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(b["x_t"].bfloat16(), b["text"].bfloat16(), b["pooled"].bfloat16(), b["t"], rope)
    assert model_flops(cfg.model, cfg.data)["total"] == pytest.approx(fc.get_total_flops(), rel=0.02)


def test_a_profiled_step_names_where_mfu_is_lost():
    """With a kernel breakdown (--profile), each part's achieved TFLOP/s and share of the peak: the GEMMs' and the
    attention's model FLOPs over their kernel time, the rest in ms."""
    from flux_cp.runs.throughput import throughput_of

    cfg = parse_config(["--config", "configs/flux_4608.yaml"], cuda_available=False)
    f = model_flops(cfg.model, cfg.data)
    d = {"config": cfg.to_dict(), "env": {"device": "NVIDIA H200"}, "world_size": 1, "dp": 1,
         "metrics": {"step_ms": {"median": 60.0}},
         "profile": {"breakdown_ms": {"gemm": 30.0, "attention": 8.0, "other": 15.0, "optimizer": 2.0, "busy": 55.0,
                                      "idle": 5.0, "step": 60.0, "comm_grad": 0.0, "comm_attention": 0.0}}}
    t = throughput_of(d | {"config": {**d["config"], "run": {**d["config"]["run"], "precision": "bf16-true"}}})
    e = t["efficiency"]
    assert e["gemm"]["tflops"] == pytest.approx(3 * f["gemm"] / 0.030 / 1e12)
    assert e["attention"]["of_peak"] == pytest.approx(3 * f["attention"] / 0.008 / 989e12)
    assert e["rest_ms"] == 17.0 and e["idle_ms"] == 5.0
    assert t["throughput/device/mfu"] == pytest.approx(3 * f["total"] / 0.060 / 989e12)


def test_the_report_names_where_a_profiled_runs_mfu_goes(tmp_path):
    """The report's MFU section over a real profiled H100 run (docs/archive/2026-12-06c, four samples a step): its
    MFU, each part's share of peak as the summary computed it, and the heaviest kernels by name; a CPU profile (no
    kernels) is left out."""
    import json
    import shutil
    from pathlib import Path

    from flux_cp.report import build
    from flux_cp.report import write as write_report

    src = Path(__file__).resolve().parents[1] / "docs/archive/2026-12-06c-h100-recipes/call3_profile_w1_b4_summary.json"
    d = json.loads(src.read_text())
    (tmp_path / "gpu").mkdir()
    shutil.copy(src, tmp_path / "gpu" / "summary.json")
    cpu = json.loads(src.read_text())
    cpu["profile"]["device"], cpu["run_name"] = "cpu", "a-cpu-profile"
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "summary.json").write_text(json.dumps(cpu))
    write_report(build(tmp_path), tmp_path / "report")
    rows = json.loads((tmp_path / "report" / "report.json").read_text())["efficiency"]
    assert [r["run"] for r in rows] == [d["run_name"]]
    r, eff = rows[0], d["throughput"]["efficiency"]
    assert r["mfu"] == d["throughput"]["throughput/device/mfu"] and r["samples_per_step"] == 4
    assert r["gemm"] == eff["gemm"] and r["attention"]["of_peak"] == eff["attention"]["of_peak"]
    assert r["other_ms"] == d["profile"]["breakdown_ms"]["other"]
    bprop, ms = d["profile"]["top_kernels_ms"]["attention"][0]
    assert "flash_bprop" in bprop and ms > 25.0  # cuDNN's flash backward: the heaviest attention kernel
    md = (tmp_path / "report" / "report.md").read_text()
    sec = md[md.index("## Where the MFU goes"):]
    assert f"| {r['run']} | 1 | 4 | {r['step_ms']:.1f} | 52% | {eff['gemm']['ms']:.1f} ms, 75% of peak |" in sec
    assert bprop[:60] in sec and d["profile"]["top_kernels_ms"]["other"][0][0][:60] in sec


def test_the_report_sets_tokens_per_s_and_mfu_beside_each_step(tmp_path):
    """Every configuration's section shows each run's step beside its tokens/s a GPU and MFU at equal work (a
    simulated rank's with its collectives priced: summary.json `ranked`), over a real H100 run (Flux.1 LoRA, FP8
    base, docs/results/2026-12-07f)."""
    import json
    import tarfile
    from pathlib import Path

    from flux_cp.report import build
    from flux_cp.report import write as write_report

    src = Path(__file__).resolve().parents[1] / "docs/results/2026-12-07f-h100-lora-fp8-cudnn/runs_call1.tar.xz"
    with tarfile.open(src) as tar:
        tar.extractall(tmp_path / "runs", members=[m for m in tar.getmembers() if "flux1_lora_fp8/fp8-rowwise/" in
                                                  m.name], filter="data")
    d = json.loads(next((tmp_path / "runs").rglob("summary.json")).read_text())
    write_report(build(tmp_path / "runs"), tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    sec = md[md.index("### Throughput at equal work"):]
    t = d["ranked"]
    assert f"| {t['step_ms']:.3g} | {t['tokens_per_s_per_gpu']:,.0f} | {t['mfu']:.1%} | " in sec.split("\n\n")[1]
    assert 0.44 < t["mfu"] < 0.46  # 372.6 ms, 12,368 tokens/s a GPU: 44.9% of LoRA's FLOPs
