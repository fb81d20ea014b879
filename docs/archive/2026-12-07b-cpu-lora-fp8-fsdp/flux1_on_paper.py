# Flux.1 (19 + 38 blocks, 4608 tokens) with LoRA, on paper: training FLOPs a sample (counted as autograd runs them)
# against full fine-tuning's, the adapters' size, and the planner's memory estimate of a rank (80 GiB device).
# Run: python docs/archive/2026-12-07b-cpu-lora-fp8-fsdp/flux1_on_paper.py
from flux_cp.config import parse_config
from flux_cp.lora import adapter_params
from flux_cp.measure.flops import lora_train_flops, model_flops
from flux_cp.plan.plans import enumerate_plans

for fuse in ("true", "false"):
    for rank, targets in ((16, "attention"), (64, "attention"), (64, "attention,mlp"), (128, "attention")):
        cfg = parse_config(["--config", "configs/flux1.yaml", "--model.fuse_qkv", fuse, "--lora-rank", str(rank),
                            "--lora-targets", targets], cuda_available=True)
        full = 3 * model_flops(cfg.model, cfg.data)["total"]
        lora = lora_train_flops(cfg.model, cfg.data, targets, rank)
        plans = {(p.world, p.weights): p for W in (1, 8) for p in enumerate_plans(
            cfg, seq_len=4608, global_batch=W, world=W, cps=("none",), weights=("ddp", "fsdp"), memory_gib_limit=80)}
        n_a = adapter_params(cfg.model, targets, rank)
        print(f"fused={fuse} r={rank} {targets}: {lora['total'] / 1e12:.1f} TFLOP a sample ({lora['total'] / full:.3f} "
              f"of full fine-tuning's {full / 1e12:.1f}), adapters {n_a / 1e6:.1f} M "
              f"({lora['adapters'] / lora['total']:.2%} of the FLOPs); GiB a rank: W=1 DDP "
              f"{plans[1, 'ddp'].memory_gib:.1f}, W=8 DDP {plans[8, 'ddp'].memory_gib:.1f}, "
              f"W=8 FSDP {plans[8, 'fsdp'].memory_gib:.1f}")
cfg = parse_config(["--config", "configs/flux1.yaml"], cuda_available=True)
(p,) = enumerate_plans(cfg, seq_len=4608, global_batch=1, world=1, cps=("none",), weights=("ddp",), memory_gib_limit=80)
print(f"full fine-tuning, W=1: {p.memory_gib:.1f} GiB estimated: {p.pruned}")
