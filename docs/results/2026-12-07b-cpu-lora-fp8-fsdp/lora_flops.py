# LoRA training FLOPs (flux_cp.measure.flops.lora_train_flops) against torch FlopCounterMode over one forward and
# backward of the tiny model with peft adapters (attention by the math kernel, whose matmuls the counter sees).
# Run: python docs/results/2026-12-07b-cpu-lora-fp8-fsdp/lora_flops.py  (columns: targets, fused qkv, counted, ours, error)
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from flux_cp.config import parse_config
from flux_cp.model import FluxDiT, image_ids, text_ids
from flux_cp.measure.flops import lora_train_flops, model_flops
from peft import LoraConfig, inject_adapter_in_model
from flux_cp.lora import lora_modules
for targets in ("attention", "attention,mlp", "mlp", "proj_out", None):
  for fuse in ("true","false"):
    cfg = parse_config(["--config","configs/tiny.yaml","--model.fuse_qkv",fuse], cuda_available=False)
    m = FluxDiT(cfg.model)
    if targets:
        names = [l.name for l in lora_modules(cfg.model, targets)]
        inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=names), m)
    d = cfg.data; mc = cfg.model
    x = torch.randn(1, d.image_height*d.image_width, mc.in_channels); text = torch.randn(1, d.text_tokens, mc.text_dim)
    pooled = torch.randn(1, mc.pooled_dim); t = torch.rand(1)
    rope = m.rope(text_ids(d.text_tokens), image_ids(d.image_height, d.image_width))
    with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
        out = m(x, text, pooled, t, rope); out.float().pow(2).mean().backward()
    got = fc.get_total_flops()
    est = lora_train_flops(cfg.model, cfg.data, targets, 4)["total"] if targets else 3*model_flops(cfg.model, cfg.data)["total"]
    print(targets, fuse, got, round(est), f"{est/got-1:+.4f}")
