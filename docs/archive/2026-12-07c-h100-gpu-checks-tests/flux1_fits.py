# Flux.1 (19 + 38 blocks) on paper: for each cell (S tokens, B samples a step, W GPUs), the plans whose estimated peak
# fits an 80 GB H100 (the planner's estimate, flux_cp/plan/plans.memory_gib, within 7.1% of the 13 measured Flux.1
# peaks: tools/memory_check.py), full fine-tuning against LoRA (rank 64, attention), by checkpointing mode.
# Run: python docs/archive/2026-12-07c-h100-gpu-checks-tests/flux1_fits.py
from flux_cp.config import parse_config
from flux_cp.plan.plans import HEADROOM, count_params, enumerate_plans

H100_GIB = 79.2  # what torch reports of an H100 80GB HBM3 (2026-12-07: 79.18 GiB)
CELLS = [(4608, 1, 1), (4608, 8, 8), (4608, 32, 8), (16896, 8, 8), (65536, 1, 8), (98304, 1, 8), (98304, 1, 1)]
for lora in (0, 64):
    cfg = parse_config(["--config", "configs/flux1.yaml", "--lora-rank", str(lora), "--model.fuse_qkv",
                        "false" if lora else "true"], cuda_available=True)
    params = count_params(cfg)
    print(f"\n{'LoRA r64 (attention)' if lora else 'full fine-tuning'}: {params / 1e9:.2f} B parameters; fits: "
          f"estimated <= {HEADROOM:.0%} of {H100_GIB} GiB in one micro-batch")
    for s, b, w in CELLS:
        plans = enumerate_plans(cfg, s, b, w, checkpointing=("none", "selective", "full"), params=params,
                                weights=("ddp", "zero2", "fsdp"), cps=("none", "ulysses", "tp"))
        ok = [p for p in plans if p.pruned is None and p.memory_gib <= HEADROOM * H100_GIB]
        best = {}
        for p in ok:  # per checkpointing mode, the plan with the smallest estimate
            if p.checkpointing not in best or p.memory_gib < best[p.checkpointing].memory_gib:
                best[p.checkpointing] = p
        smallest = min((p for p in plans if p.pruned is None), key=lambda p: p.memory_gib, default=None)
        line = ", ".join(f"{ac}: {len([p for p in ok if p.checkpointing == ac])} plans (least {q.name} "
                         f"{q.memory_gib:.1f} GiB)" for ac, q in sorted(best.items()))
        print(f"  S={s:6d} B={b:2d} W={w}: " + (line or f"none fits (least: {smallest.name} "
                                                         f"{smallest.memory_gib:.1f} GiB)"))
