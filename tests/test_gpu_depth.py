"""GPU checks of the settings Flux.1 at its own depth uses (pytest -m gpu): FP8 linears train as bf16 does within a
stated tolerance, a LoRA base's too; FSDP2's tuning runs compiled on CUDA and changes the collectives it should; its
CPU offload trains as without it."""

import json

import pytest
import torch

from .conftest import ROOT, TINY, bench

pytestmark = pytest.mark.gpu

FLUX = ROOT / "configs" / "flux_4608.yaml"
# FP8 against bf16 on the synthetic data: the mean loss of the last 10 of 50 steps within 2% (relative), every step
# within 5% (bf16's own rounding moves a step's loss by ~0.1%; float8's e4m3 casts by more, and the runs' paths part)
FP8_MEAN_RTOL, FP8_STEP_RTOL = 0.02, 0.05


def _run(out, *args) -> dict:
    proc = bench("--accelerator", "gpu", "--wandb-mode", "disabled", "--output", out, *args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_fp8_loss_tracks_bf16_over_50_steps(tmp_path, recipe):
    """Flux's dims (2 + 4 blocks, hidden 3072: every token GEMM converted) at 1536 tokens, 50 optimizer steps of the
    same synthetic batches from the same init: FP8's losses stay within FP8_MEAN_RTOL / FP8_STEP_RTOL of bf16's."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs an FP8 GPU (H100 or newer)")
    args = ("--config", FLUX, "--data.image_height", 32, "--data.image_width", 32, "--warmup-steps", 1,
            "--steps", 49, "--timing", "false")
    ref = _run(tmp_path / "bf16", *args)["loss"]
    got = _run(tmp_path / recipe, *args, "--fp8", recipe)
    assert got["fp8"] == {"recipe": recipe, "mfu_peak": "bf16 dense"} and len(got["loss"]) == len(ref) == 50
    step = [abs(a - b) / abs(b) for a, b in zip(got["loss"], ref)]
    mean = abs(sum(got["loss"][-10:]) - sum(ref[-10:])) / abs(sum(ref[-10:]))
    print(f"fp8 {recipe}: last-10 mean loss {sum(got['loss'][-10:]) / 10:.5f} vs bf16 {sum(ref[-10:]) / 10:.5f} "
          f"({mean:.2%}); largest step difference {max(step):.2%}")
    assert mean <= FP8_MEAN_RTOL and max(step) <= FP8_STEP_RTOL, (mean, max(step))


GRAPH = ("--compile", "true", "--step-graph", "true")


@pytest.mark.parametrize("recipe,build", [("tensorwise", ()), ("rowwise", GRAPH)],
                         ids=["tensorwise-eager", "rowwise-compiled-graph"])
def test_lora_fp8_loss_tracks_lora_bf16_over_50_steps(tmp_path, recipe, build):
    """LoRA (rank 64, attention) on Flux's dims, its frozen base in float8 (FrozenFloat8Linear, cast once): 50 steps
    within the same tolerances of LoRA in bf16, eager and compiled under the step graph (the cached weights and
    the on-device scales capture)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs an FP8 GPU (H100 or newer)")
    args = ("--config", FLUX, "--data.image_height", 32, "--data.image_width", 32, "--warmup-steps", 3,
            "--steps", 47, "--timing", "false", "--lora-rank", 64, "--weights", "ddp", *build)  # the graph: >= 3
    ref = _run(tmp_path / "bf16", *args)["loss"]
    got = _run(tmp_path / recipe, *args, "--fp8", recipe)
    assert got["fp8"]["base"].startswith("frozen") and len(got["loss"]) == len(ref) == 50
    step = [abs(a - b) / abs(b) for a, b in zip(got["loss"], ref)]
    mean = abs(sum(got["loss"][-10:]) - sum(ref[-10:])) / abs(sum(ref[-10:]))
    print(f"LoRA fp8 {recipe} {' '.join(map(str, build))}: last-10 mean loss {sum(got['loss'][-10:]) / 10:.5f} vs "
          f"bf16 {sum(ref[-10:]) / 10:.5f} ({mean:.2%}); largest step difference {max(step):.2%}")
    assert mean <= FP8_MEAN_RTOL and max(step) <= FP8_STEP_RTOL, (mean, max(step))


def test_fsdp_fp8_all_gather_trains_as_without_it_and_gathers_a_byte_a_weight(tmp_path):
    """--fsdp-fp8-all-gather (torchao's float8 all-gather, its scales precomputed after each optimizer step):
    - one real GPU, FSDP2 over a group of one, tensorwise FP8: 50 steps within 0.5% (mean of the last 10) and 1%
      (every step) of the same run without it: the same float8 weights, cast before the gather instead of after;
    - rank 0 of 8 over the fake group, compiled per block (AOTAutograd refused the single blocks' aliasing outputs
      with float8 weights on the H200, 2026-12-07g): the all-gathers carry a byte, not two, of every converted
      linear's weight, twice a step (the forward's gather, and the backward's after resharding; within 1%: FSDP2
      pads shards)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs an FP8 GPU (H100 or newer)")
    from flux_cp.config import parse_config
    from flux_cp.train.fp8 import fp8_linears

    args = ("--config", FLUX, "--data.image_height", 32, "--data.image_width", 32, "--weights", "fsdp", "--fp8",
            "tensorwise", "--timing", "false")
    one = ("--devices", 1, "--warmup-steps", 1, "--steps", 49)
    ref = _run(tmp_path / "w1", *args, *one)["loss"]
    got = _run(tmp_path / "w1-ag8", *args, *one, "--fsdp-fp8-all-gather", "true")["loss"]
    step = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    mean = abs(sum(got[-10:]) - sum(ref[-10:])) / abs(sum(ref[-10:]))
    print(f"float8 all-gather: last-10 mean loss {mean:.3%} from without, largest step {step:.3%}")
    assert len(got) == len(ref) == 50 and mean <= 0.005 and step <= 0.01, (mean, step)
    # flash named: cuDNN's attention faulted in this compiled step's backward (2026-12-07h-h100-lora-cudnn-faults)
    sim = ("--simulate-world", 8, "--cp-degree", 1, "--data.global_batch", 8, "--warmup-steps", 2, "--steps", 3,
           "--regions-every", 1, "--compile", "true", "--sdpa-backend", "flash")
    plain, ag8 = (_run(tmp_path / n, *args, *sim, *x)["comm"]["per_step"]
                  for n, x in (("w8", ()), ("w8-ag8", ("--fsdp-fp8-all-gather", "true"))))
    converted = sum(lin.fan_in * lin.fan_out for lin in fp8_linears(parse_config(["--config", str(FLUX)],
                                                                                  cuda_available=True).model))
    saved = plain["all_gather"]["bytes"] - ag8["all_gather"]["bytes"]
    print(f"all-gathered a step: {plain['all_gather']['bytes'] / 2**20:.1f} MiB without, "
          f"{ag8['all_gather']['bytes'] / 2**20:.1f} with; all-reduces {plain.get('all_reduce')} / "
          f"{ag8.get('all_reduce')}")
    assert saved == pytest.approx(2 * converted, rel=0.01), (plain, ag8, converted)


def test_tuned_fsdp_compiles_and_changes_its_collectives_on_cuda(tmp_path):
    """Rank 0 of 8 over the fake group, compiled per block: keeping the last two blocks whole after the forward drops
    their two backward all-gathers; prefetching two ahead and an fp32 reduce compile and run their steps."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    base = ("--config", TINY, "--simulate-world", 8, "--cp-degree", 1, "--data.global_batch", 8, "--weights", "fsdp",
            "--compile", "true", "--warmup-steps", 2, "--steps", 3, "--regions-every", 1)
    plain = _run(tmp_path / "plain", *base)
    tuned = _run(tmp_path / "tuned", *base, "--fsdp-prefetch", 2, "--fsdp-reshard-last", 2,
                 "--fsdp-reduce-dtype", "fp32")
    ag = [d["comm"]["per_step"]["all_gather"]["count"] for d in (plain, tuned)]
    assert ag[1] == ag[0] - 2, ag
    # a simulated rank's collectives move nothing, so it records no loss: the steps ran and were timed
    assert tuned["complete"] and tuned["metrics"]["step_ms"]["median"] > 0, tuned.get("error")


def test_lora_under_the_ring_trains_as_plain_sdpa_on_cuda(tmp_path):
    """peft's adapters under torch's context_parallel (the ring at world size 1: its dispatch in the forward and the
    backward), fp32 (the efficient kernel): the losses of the plain step with the same adapters; only they train."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ("--config", TINY, "--precision", "32-true", "--steps", 8, "--warmup-steps", 2, "--lora-rank", 4,
            "--lora-targets", "attention,mlp")
    ring = _run(tmp_path / "ring", *args, "--cp", "torch")
    plain = _run(tmp_path / "plain", *args, "--cp", "none", "--sdpa-backend", "efficient")
    torch.testing.assert_close(torch.tensor(ring["loss"]), torch.tensor(plain["loss"]), rtol=1e-4, atol=0)
    assert ring["optimizer_params"] == ring["lora"]["trainable_params"] < ring["params"] / 10


def test_lora_with_torchs_pick_of_attention_trains_on_cuda(tmp_path):
    """LoRA with --sdpa-backend auto, bf16, Flux's q/k/v unfused (2 + 4 blocks of Flux's dims at 1536 tokens): the
    run pins flash (torch's pick, cuDNN, failed in the first step on an H100 with torch 2.11) and trains."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    d = _run(tmp_path / "lora", "--config", FLUX, "--data.image_height", 32, "--data.image_width", 32, "--steps", 4,
             "--warmup-steps", 2, "--lora-rank", 64, "--model.fuse_qkv", "false", "--harness", "bare")
    assert d["sdpa_backend"] == "flash" and all(x == x for x in d["loss"]), (d["sdpa_backend"], d["loss"])


@pytest.mark.parametrize("harness", ["lightning", "bare"])
def test_cpu_offloaded_fsdp_trains_as_without_it_in_a_fraction_of_the_memory(tmp_path, harness):
    """--fsdp-cpu-offload on one GPU (FSDP2 over a group of one, CPUOffloadPolicy with pinned memory): Flux's 2 + 4
    blocks in fp32, 10 steps, the same losses as FSDP without it within 1e-4 (AdamW steps on the CPU, not on CUDA:
    rounding differs), the GPU's peak under a third of its (the shards, gradients and AdamW state stay on the host)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ("--config", FLUX, "--data.image_height", 32, "--data.image_width", 32, "--weights", "fsdp", "--precision",
            "32-true", "--warmup-steps", 1, "--steps", 9, "--timing", "false", "--harness", harness)
    ref = _run(tmp_path / "fsdp", *args)
    got = _run(tmp_path / "offload", *args, "--fsdp-cpu-offload", "true")
    step = max(abs(a - b) / abs(b) for a, b in zip(got["loss"], ref["loss"]))
    mem = got["memory"]["allocated_gib"], ref["memory"]["allocated_gib"]
    print(f"cpu offload ({harness}): largest step difference {step:.2e}; peak {mem[0]:.1f} GiB, {mem[1]:.1f} without")
    assert len(got["loss"]) == len(ref["loss"]) == 10 and step <= 1e-4, step
    assert mem[0] < mem[1] / 3, mem
