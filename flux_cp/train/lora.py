"""LoRA (--lora-rank r), applied to a built model from outside it, before any sharding: each linear flux_cp/lora.py
names is wrapped as peft wraps it (the library diffusers' own LoRA training uses), the base frozen in the run's
precision, the adapters trained (B starts at zero: the step-0 model is the base). DDP, ZeRO and FSDP2 then see
parameters of which only the adapters want gradients: DDP and ZeRO sync those alone, FSDP2 still shards the frozen
base (its all-gathers stay; its reduce-scatters carry the adapters' gradients only).

Why not peft itself: diffusers imports peft, and with it transformers, whenever peft is installed, in every process
that imports a diffusers model (measured: the multi-rank tests 47% slower, 156 s against 106 s). LoraLinear is
peft's LoRA Linear for one adapter without dropout (its module and parameter names, its init and RNG draws, its
forward), so adapters saved from here load into peft and back; tests/test_lora.py checks it against peft where
peft is installed (the peft set of tests, `make test-peft`).
"""

import math

import torch
from torch import nn

from flux_cp.lora import lora_modules


class LoraLinear(nn.Module):
    """y = base(x) + B(A(x)) * alpha / r, as peft.tuners.lora.Linear with one adapter ("default"), no dropout."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base_layer = base
        self.lora_dropout = nn.ModuleDict({"default": nn.Identity()})
        # peft's draws, in its order: each nn.Linear's own init, then A again (kaiming, a=sqrt(5)); B zero
        self.lora_A = nn.ModuleDict({"default": nn.Linear(base.in_features, rank, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(rank, base.out_features, bias=False)})
        nn.init.kaiming_uniform_(self.lora_A["default"].weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B["default"].weight)
        self.lora_A.to(base.weight.device, base.weight.dtype)
        self.lora_B.to(base.weight.device, base.weight.dtype)
        self.scaling = alpha / rank

    @property
    def weight(self) -> torch.Tensor:  # as peft's layer: code that reads a linear's weight gets the base's
        return self.base_layer.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base_layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        a, b = self.lora_A["default"], self.lora_B["default"]
        return (out + b(a(x.to(a.weight.dtype))) * self.scaling).to(out.dtype)


def apply_lora(model, run) -> None:
    """Adapters of rank run.lora_rank on run.lora_targets' linears, everything else frozen (summary.json's
    lora.trainable_params counts them: flux_cp/lora.py's adapter_params)."""
    if not run.lora_rank:
        return
    targets = {lin.name for lin in lora_modules(model.cfg, run.lora_targets)}
    alpha = run.lora_alpha if run.lora_alpha is not None else run.lora_rank  # diffusers' Flux LoRA default: alpha = r
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in list(model.named_modules()):  # forward order, as peft walks the model
        if name in targets:
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, LoraLinear(module, run.lora_rank, alpha))
