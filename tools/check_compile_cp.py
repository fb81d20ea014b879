"""Does torch.compile compose with torch's context_parallel on this torch? (GPU, world size 1)

Compiles the blocks of a small Flux model, runs forward + backward under `--cp torch`, and compares
with eager. Prints one verdict line; train_bench refuses `--compile --cp torch` on its evidence.

    python tools/check_compile_cp.py
"""

import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from flux_cp.config import DataConfig, ModelConfig  # noqa: E402
from flux_cp.data import make_batch  # noqa: E402
from flux_cp.model import FluxDiT, image_ids, text_ids  # noqa: E402
from flux_cp.parallel.cp import apply_cp  # noqa: E402
from flux_cp.parallel.registry import make_strategy  # noqa: E402


def fwd_bwd(model, strategy, batch, rope):
    model.zero_grad(set_to_none=True)
    with strategy.step_context():
        out = model(batch["x_t"], batch["text"], batch["pooled"], batch["t"], rope)
        torch.nn.functional.mse_loss(out.float(), batch["target"].float()).backward()
    return out.float()


def main():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    mcfg = ModelConfig(num_heads=4, head_dim=128, double_blocks=1, single_blocks=1, text_dim=256, pooled_dim=64)
    dcfg = DataConfig(image_height=32, image_width=32, text_tokens=128)
    torch.manual_seed(0)
    model = FluxDiT(mcfg).to(dev, torch.bfloat16)
    batch = {k: v.to(dev, torch.bfloat16) for k, v in make_batch(dcfg, mcfg, 0).items()}
    rope = model.rope(text_ids(dcfg.text_tokens).to(dev), image_ids(32, 32).to(dev))
    cp = make_strategy("torch", 0, 1, dev)
    apply_cp(model, cp)
    ref = fwd_bwd(model, cp, batch, rope)
    for blk in (*model.double_blocks, *model.single_blocks):
        blk.compile()
    try:
        out = fwd_bwd(model, cp, batch, rope)
        err = (out - ref).abs().max().item()
        print(f"torch {torch.__version__}: compile + context_parallel ran; max |out - eager| = {err:.3g}")
    except Exception as e:
        traceback.print_exc(limit=3)
        line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"torch {torch.__version__}: compile + context_parallel FAILS: {type(e).__name__}: {line[:300]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
