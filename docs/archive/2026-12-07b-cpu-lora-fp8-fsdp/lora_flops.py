# LoRA training FLOPs (flux_cp.measure.flops.lora_train_flops) against torch's FlopCounterMode over one forward and
# backward of the tiny model with its LoRA adapters (flux_cp's, bit-equal to peft's: tests/test_lora.py, make
# test-peft), attention by the math kernel, whose matmuls the counter sees.
# Run: python docs/archive/2026-12-07b-cpu-lora-fp8-fsdp/lora_flops.py
# Columns: targets (None: full fine-tuning, 3 x forward), fused q/k/v, counted, ours, relative error.
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from flux_cp.config import parse_config
from flux_cp.measure.flops import lora_train_flops, model_flops
from flux_cp.model import image_ids, text_ids
from flux_cp.train.step import build_model

for targets in ("attention", "attention,mlp", "mlp", "proj_out", None):
    for fuse in ("true", "false"):
        lora = ["--lora-rank", "4", "--lora-targets", targets] if targets else []
        cfg = parse_config(["--config", "configs/tiny.yaml", "--model.fuse_qkv", fuse, *lora], cuda_available=False)
        m, d, mc = build_model(cfg), cfg.data, cfg.model  # its adapters applied, the rest frozen
        x = torch.randn(1, d.image_height * d.image_width, mc.in_channels)
        text, pooled, t = torch.randn(1, d.text_tokens, mc.text_dim), torch.randn(1, mc.pooled_dim), torch.rand(1)
        rope = m.rope(text_ids(d.text_tokens), image_ids(d.image_height, d.image_width))
        with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
            m(x, text, pooled, t, rope).float().pow(2).mean().backward()
        got = fc.get_total_flops()
        est = lora_train_flops(mc, d, targets, 4)["total"] if targets else 3 * model_flops(mc, d)["total"]
        print(targets, fuse, got, round(est), f"{est / got - 1:+.4f}")
