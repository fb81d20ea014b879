"""Where Flux.1's measured steps go, by part, and what FP8 linears and cuDNN's attention can give them (arithmetic on
measured figures, no device): `python docs/archive/2026-12-07e-cpu-lora-fp8/step_budget.py` from the repository root.
`--profiled DIR`: the suite flux1_profile's runs (configs/suites/), their kernels by part measured beside the parts
predicted here.

Inputs, all committed:
  - the kernels of the best 2 + 4-block W=1 step at four samples, by part (H100, compiled, one CUDA graph; [O]:
    docs/archive/2026-12-06c-h100-recipes/call3_profile_w1_b4_summary.json): GEMMs, attention (cuDNN), the rest;
  - Flux.1's steps at its own depth (H100, rank 0 of 8; [S]:
    docs/archive/2026-12-07d-h100-flux1-depth-lora/runs.tar.xz);
  - flash against cuDNN in the team's W=1 step on 2 + 4 blocks (H200, eager; [A]: 69.2 against 60.9 ms a step).
The model: each part scales to Flux.1 by its FLOPs (GEMMs by the GEMM FLOPs, attention by the attention FLOPs, the
rest by the blocks); LoRA's GEMMs by LoRA's GEMM FLOPs (no weight gradient for the frozen base).
"""

import argparse
import json
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from flux_cp.config import parse_config  # noqa: E402
from flux_cp.measure.flops import lora_train_flops, model_flops  # noqa: E402

PROFILE = ROOT / "docs/archive/2026-12-06c-h100-recipes/call3_profile_w1_b4_summary.json"
RUNS = ROOT / "docs/archive/2026-12-07d-h100-flux1-depth-lora/runs.tar.xz"
FLASH_OVER_CUDNN_MS = (69.2 - 60.9) / 6  # [A]: a block's flash attention over cuDNN's, a sample of 4608 tokens


def cfg(name):
    return parse_config(["--config", str(ROOT / "configs" / name)], cuda_available=False)


def run(tar, name):
    d = json.load(tar.extractfile(f"{name}/summary.json"))
    return d["metrics"]["step_ms"]["median"], d["throughput"]["throughput/device/mfu"]


def profiled(folder: Path, predicted: dict) -> None:
    """Each flux1_profile run's kernels by part (a step's, ms) beside the parts predicted for it."""
    print(f"\n## Measured by kernel ({folder}) against the prediction")
    print(f"{'run':16} {'part':10} {'measured':>9} {'predicted':>9}")
    for name, parts in predicted.items():
        runs = sorted(folder.glob(f"{name}/summary.json"))
        if not runs:
            print(f"{name:16} not run")
            continue
        d = json.loads(runs[0].read_text())
        got = (d.get("profile") or {}).get("breakdown_ms")
        if not got:
            print(f"{name:16} no profile ({'complete' if d.get('complete') else d.get('error', 'incomplete')})")
            continue
        for part, ms in parts.items():
            print(f"{name:16} {part:10} {got[part]:9.1f} {ms:9.1f}")
        print(f"{name:16} {'step':10} {got['step']:9.1f} {d['metrics']['step_ms']['median']:9.1f} (its timed median)")


def main(argv=None):
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--profiled", type=Path, help="flux1_profile's output folder (its runs' folders inside)")
    args = a.parse_args(argv)
    shallow, full, lora = cfg("flux_4608.yaml"), cfg("flux1.yaml"), cfg("flux1_lora.yaml")
    p = json.loads(PROFILE.read_text())
    parts = p["profile"]["breakdown_ms"]
    samples = p["config"]["data"]["batch_size"]
    fs, ff = model_flops(shallow.model, shallow.data), model_flops(full.model, full.data)
    blocks = (full.model.double_blocks + full.model.single_blocks) / (shallow.model.double_blocks
                                                                      + shallow.model.single_blocks)
    # a sample's parts at Flux.1's depth, full fine-tune, cuDNN attention
    gemm = parts["gemm"] / samples * ff["gemm"] / fs["gemm"]
    attn = parts["attention"] / samples * ff["attention"] / fs["attention"]
    rest = parts["other"] / samples * blocks
    print(f"2 + 4 blocks, W=1, {samples} samples ({p['env']['device']}): a sample's GEMMs "
          f"{parts['gemm'] / samples:.2f} ms, attention {parts['attention'] / samples:.2f}, the rest "
          f"{parts['other'] / samples:.2f}; AdamW {parts['optimizer']:.2f} a step")
    print(f"Flux.1, a sample (x{ff['gemm'] / fs['gemm']:.2f} GEMM FLOPs, x{ff['attention'] / fs['attention']:.2f} "
          f"attention, x{blocks:.2f} blocks): GEMMs {gemm:.1f} ms, attention {attn:.1f} (cuDNN), the rest {rest:.1f}")

    with tarfile.open(RUNS) as tar:
        bf16, mfu16 = run(tar, "flux1_depth/fp8-none")  # B = 4W, FSDP compiled, selective
        tw, _ = run(tar, "flux1_depth/fp8-tensorwise")
        rw, _ = run(tar, "flux1_depth/fp8-rowwise")
        bw16, _ = run(tar, "flux1_depth/fp8-none_checkpointing-none_global_batch-8")  # B = W, no checkpointing
        bwrw, _ = run(tar, "flux1_depth/fp8-rowwise_checkpointing-none_global_batch-8")
        lo, lo_mfu = run(tar, "flux1_lora/simulate_world-8_cp-none_cp_degree-1_global_batch-8_compile-true_step_graph"
                              "-true_warmup_steps-12")  # LoRA, B = W, DDP compiled, one CUDA graph, flash pinned

    print("\n## Full fine-tune, 4 samples a rank (FSDP over 8, compiled, selective checkpointing), bf16 [S]")
    g4 = 4 * gemm
    print(f"measured {bf16:.1f} ms ({mfu16:.1%} MFU); predicted parts: GEMMs {g4:.0f} ms ({g4 / bf16:.0%} of the "
          f"step), attention {4 * attn:.0f}, the rest {4 * rest:.0f}, sum {4 * (gemm + attn + rest):.0f} "
          f"(the remainder: selective's recompute, FSDP's copies, AdamW on 1/8)")
    for name, ms in (("tensorwise", tw), ("rowwise", rw)):
        print(f"FP8 {name}: {ms:.1f} ms, {bf16 / ms:.2f}x; the GEMMs' net speed-up it implies (casts included) "
              f"{g4 / (g4 - (bf16 - ms)):.2f}x")
    # what FP8 saves = samples x (a sample's net saving) - (a fixed cost a step: casting every weight, whatever B)
    per_sample = ((bf16 - rw) - (bw16 - bwrw)) / 3
    print(f"rowwise at one sample a rank (no checkpointing): {bwrw:.1f} ms against bf16's {bw16:.1f}, "
          f"{bw16 / bwrw:.2f}x; with B = 4W: a sample saves ~{per_sample:.0f} ms, the weights' casts cost "
          f"~{per_sample - (bw16 - bwrw):.0f} ms a step, whatever B (two points, checkpointing unlike: an estimate)")
    need = g4 / (g4 - (bf16 - bf16 / 1.3))
    of_peak = 3 * ff["gemm"] * 4 / (g4 / 1e3) / 989e12  # the bf16 GEMMs' training FLOPs over their time
    print(f"1.3x needs the GEMMs {need:.2f}x faster, casts included (FP8's dense peak is 2x bf16's, and bf16's GEMMs "
          f"already run at {of_peak:.0%} of theirs); GEMMs for free would give {bf16 / (bf16 - g4):.2f}x")

    print("\n## LoRA, a sample a rank (DDP over 8, compiled, one CUDA graph; flash pinned under LoRA) [S]")
    lf = lora_train_flops(lora.model, lora.data, lora.run.lora_targets, lora.run.lora_rank)
    lgemm = gemm * lf["gemm"] / (3 * ff["gemm"])
    flash = attn + FLASH_OVER_CUDNN_MS * (full.model.double_blocks + full.model.single_blocks)
    pred = lgemm + flash + rest
    print(f"measured {lo:.1f} ms ({lo_mfu:.1%} of LoRA's FLOPs); predicted parts: GEMMs {lgemm:.0f} ms (LoRA's "
          f"{lf['gemm'] / (3 * ff['gemm']):.2f} of the full fine-tune's), attention {flash:.0f} (flash; cuDNN "
          f"{attn:.0f}), the rest {rest:.0f}: {pred:.0f} ms, {pred / lo - 1:+.1%}")
    net_tw = g4 / (g4 - (bf16 - tw))
    cases = {"cuDNN's attention": flash - attn, "the base in FP8 (tensorwise's net GEMM speed-up)":
             lgemm * (1 - 1 / net_tw)}
    cases["both"] = sum(cases.values())
    for name, saved in cases.items():
        ms = lo - saved
        print(f"  {name}: {ms:.0f} ms, {lo_mfu * lo / ms:.1%} of LoRA's FLOPs ({lo / ms:.2f}x)")
    if args.profiled:
        lora_run = next(iter(sorted(args.profiled.glob("*lora_rank-64*"))), Path("lora")).name
        profiled(args.profiled, {
            "fp8-none": {"gemm": g4, "attention": 4 * attn, "other": 4 * rest},
            "fp8-tensorwise": {"gemm": g4 / net_tw, "attention": 4 * attn, "other": 4 * rest},
            lora_run: {"gemm": lgemm, "attention": flash, "other": rest}})


if __name__ == "__main__":
    main()
