"""Does cuDNN's attention backward reuse a cached graph across output-gradient (dO) layouts? torch keys that cache on
q, k, v's strides alone (aten/src/ATen/native/cudnn/MHA.cpp, `MHACacheKeyWrapper`), while the graph it builds bakes in
dO's strides. Two backward calls with the same q, k, v and dO of two layouts (dense, and a slice of a 5x wider row, as
Flux's single blocks hand it: [attention, MLP] -> proj_out), in both orders, each against fp32 math; then the same
with flux_cp's remedy (dO copied into the output's strides, `flux_cp.parallel.cp.sdpa`). One case per process (an
illegal memory access poisons the CUDA context; check_cudnn_qkv.run_case), a fault named.

    python tools/check_cudnn_grad_layout.py             # one line per (order, remedy)
    python tools/check_cudnn_grad_layout.py --flux-step # (CPU) which of Flux's SDPA calls share a key, dO apart
"""

import argparse
import sys

from check_cudnn_qkv import run_case  # tools/ is the script's own folder on sys.path

CASE = """
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from flux_cp.parallel.cp import sdpa
B, H, S, D = 1, 24, 4608, 128
torch.manual_seed(0)
q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
           for _ in range(3))  # (B, H, S, D), BSHD in memory as in Flux
def grad_out(layout):  # (B, H, S, D)
    width = H * D if layout == "dense" else 5 * H * D
    g = torch.randn(B, S, width, device="cuda", dtype=torch.bfloat16)[..., :H * D]
    return g.unflatten(-1, (H, D)).transpose(1, 2)
errs = []
for layout in {order!r}:
    dO = grad_out(layout)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = sdpa(q, k, v, cudnn_possible={remedy})
        got = torch.autograd.grad(out, (q, k, v), dO)
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        want = torch.autograd.grad(F.scaled_dot_product_attention(qf, kf, vf), (qf, kf, vf), dO.float())
    torch.cuda.synchronize()
    err = max(((g.float() - w).abs().max() / w.abs().max()).item() for g, w in zip(got, want))
    errs.append(f"{{layout}} dO: {{err:.3g}}")
print(", ".join(errs))
"""


def flux_step_layouts() -> None:
    """Each SDPA call of one eager Flux step (a small model, Flux's structure; q/k/v fused and unfused, CPU): q, k, v's
    strides (cuDNN's cache key) and dO's as the block hands it, and which calls share a key with another dO."""
    import torch
    import torch.nn.functional as F

    from flux_cp.config import DataConfig, ModelConfig
    from flux_cp.data import make_batch
    from flux_cp.model import FluxDiT, image_ids, text_ids
    from flux_cp.parallel.cp import apply_cp
    from flux_cp.parallel.registry import make_strategy

    for fused in (True, False):
        mcfg = ModelConfig(num_heads=2, head_dim=16, double_blocks=2, single_blocks=2, text_dim=32, pooled_dim=16,
                           rope_axes=[4, 6, 6], fuse_qkv=fused)
        dcfg = DataConfig(image_height=4, image_width=4, text_tokens=8)
        model, calls = FluxDiT(mcfg), []
        strategy = make_strategy("none", 0, 1, torch.device("cpu"))

        def attention(q, k, v, calls=calls):
            out = F.scaled_dot_product_attention(q, k, v)
            call = {"key": (q.stride(), k.stride(), v.stride())}
            out.grad_fn.register_prehook(lambda g, rec=call: rec.__setitem__("dO", g[0].stride()))
            calls.append(call)
            return out

        strategy.attention = attention
        apply_cp(model, strategy)
        b = make_batch(dcfg, mcfg, 0)
        rope = model.rope(text_ids(8), image_ids(4, 4))
        model(b["x_t"], b["text"], b["pooled"], b["t"], rope).pow(2).mean().backward()
        kinds = ["double"] * mcfg.double_blocks + ["single"] * mcfg.single_blocks
        print(f"q/k/v {'fused' if fused else 'unfused'} (strides of (B, H, S, D); S = {8 + 16}, H x D = 32):")
        for kind, c in zip(kinds, calls):
            clash = {o["dO"] for o in calls if o["key"] == c["key"]} - {c["dO"]}
            print(f"  {kind}: q {c['key'][0]} k {c['key'][1]} v {c['key'][2]} dO {c['dO']}"
                  f"{'  <- shares its key with dO ' + str(sorted(clash)) if clash else ''}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flux-step", action="store_true", help="(CPU) the key and dO strides of Flux's SDPA calls")
    if ap.parse_args().flux_step:
        flux_step_layouts()
        sys.exit()
    print("max |dq, dk, dv - fp32 math| / max |fp32|, per call in order (bf16 alone: ~1e-2)")
    for remedy in (False, True):
        for order in (("wide", "dense"), ("dense", "wide")):
            ok, line = run_case(CASE.format(order=order, remedy=remedy), timeout=300)
            print(f"{' then '.join(order):15s} remedy {'on ' if remedy else 'off'}: {'' if ok else 'FAULT: '}{line}")
