"""LoRA (--lora-rank r), applied to a built model from outside it, before any sharding: peft's adapters (the
library diffusers' own LoRA training uses) on the linears flux_cp/lora.py names, the base frozen in the run's
precision, the adapters trained (B starts at zero: the step-0 model is the base). DDP, ZeRO and FSDP2 then see
parameters of which only the adapters want gradients: DDP and ZeRO sync those alone, FSDP2 still shards the frozen
base (its all-gathers stay; its reduce-scatters carry the adapters' gradients only)."""

from flux_cp.lora import lora_modules


def apply_lora(model, run) -> int:
    """Adapters of rank run.lora_rank on run.lora_targets' linears; returns the trainable parameters' count."""
    if not run.lora_rank:
        return sum(p.numel() for p in model.parameters())
    from peft import LoraConfig, inject_adapter_in_model

    names = [lin.name for lin in lora_modules(model.cfg, run.lora_targets)]
    alpha = run.lora_alpha if run.lora_alpha is not None else run.lora_rank  # diffusers' Flux LoRA default: alpha = r
    inject_adapter_in_model(LoraConfig(r=run.lora_rank, lora_alpha=alpha, target_modules=names), model)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)  # peft froze everything else
