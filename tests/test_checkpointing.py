"""Activation checkpointing (flux_cp/train/checkpointing.py) trains exactly as no checkpointing: fp64, 10 optimizer
steps, the same losses, first-step gradients and final parameters as the single process, alone and with the strategies
it combines with on real gloo ranks (FSDP, ZeRO-2, Ulysses, TP); its recompute re-issues the forward's collectives,
which the ledger counts."""

import json

import pytest

from flux_cp.config import ConfigError, parse_config
from flux_cp.train.checkpointing import apply_checkpointing

from .conftest import TINY, assert_exact, exact_run, main_in_process


@pytest.mark.parametrize("args", [("--checkpointing", "full"), ("--checkpointing", "selective"),
                                  ("--checkpointing", "full", "--checkpoint-fraction", "0.5")],
                         ids=["full", "selective", "full-half"])
def test_one_process_checkpointed_trains_as_without(single_process, tmp_path, args):
    got = exact_run(tmp_path, "--devices", 1, *args)
    d = got["summary"]
    assert d["config"]["run"]["checkpointing"] == args[1]
    assert d["checkpointing"]["blocks"] == (2 if "0.5" in args else 4)  # the tiny model: 2 + 2 blocks
    assert_exact(got, single_process(1), rtol=1e-12)


@pytest.mark.parametrize("args", [
    ("--cp", "allgather-kv", "--weights", "fsdp", "--checkpointing", "full"),
    ("--cp", "ulysses", "--weights", "zero2", "--checkpointing", "selective"),
    ("--cp", "ulysses", "--weights", "ddp", "--checkpointing", "full"),
    ("--cp", "tp", "--harness", "bare", "--checkpointing", "selective"),
], ids=["agkv-fsdp-full", "ulysses-zero2-selective", "ulysses-ddp-full", "tp-bare-selective"])
def test_checkpointed_ranks_train_as_one_process(single_process, tmp_path, args):
    got = exact_run(tmp_path, "--devices", 2, *args)
    assert got["summary"]["world_size"] == 2 and got["summary"]["checkpointing"]["blocks"] == 4
    assert_exact(got, single_process(1), rtol=1e-10)


def test_full_recompute_issues_the_forwards_collectives_again(tmp_path):
    """Ulysses' all-to-alls: 4 a block forward (q, k, v in one; the output back), 4 backward; full recompute runs the
    forward's again inside the backward: 6 a block. The ledger counts what each rank sends."""
    counts = {}
    for mode in ("none", "full"):
        out = tmp_path / mode
        rc, lines = main_in_process("--config", TINY, "--simulate-world", 2, "--cp", "ulysses", "--checkpointing", mode,
                                    "--steps", 2, "--warmup-steps", 1, "--wandb-mode", "disabled", "--output", out,
                                    "--regions-every", 1)
        assert rc == 0, lines[-5:]
        counts[mode] = json.loads((out / "summary.json").read_text())["comm"]["per_step"]["all_to_all"]["count"]
    assert counts["full"] == counts["none"] * 3 // 2, counts


def test_each_mode_recomputes_what_it_should_and_full_keeps_less():
    """The ops a training step runs, counted below autograd: full recomputes every block's forward in the backward
    (its GEMMs again), selective only the ops between the GEMMs and attention (LayerNorm, GELU again; GEMMs not), none
    nothing. And full's forward saves a fraction of none's tensors for the backward (autograd's saved-tensor hook)."""
    from collections import Counter

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from flux_cp.data import make_batch
    from flux_cp.model import FluxDiT, image_ids, text_ids

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    cfg = parse_config(["--config", str(TINY)], cuda_available=False)
    b = make_batch(cfg.data, cfg.model, 0)
    ops, saved = {}, {}
    for mode in ("none", "selective", "full"):
        torch.manual_seed(0)
        model = FluxDiT(cfg.model)
        apply_checkpointing(model, mode)
        rope = model.rope(text_ids(cfg.data.text_tokens), image_ids(cfg.data.image_height, cfg.data.image_width))
        kept = {}  # by storage: a tensor saved twice (or views of one) counts once

        def pack(t, kept=kept):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with Count() as count, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(b["x_t"], b["text"], b["pooled"], b["t"], rope).square().mean().backward()
        ops[mode], saved[mode] = count.ops, sum(kept.values())
    gemms = {m: ops[m]["mm"] + ops[m]["addmm"] for m in ops}
    assert gemms["selective"] == gemms["none"] < gemms["full"], gemms
    for op in ("native_layer_norm", "gelu"):
        assert ops["none"][op] < ops["selective"][op] == ops["full"][op], (op, {m: ops[m][op] for m in ops})
    assert saved["full"] < 0.2 * saved["none"], saved


def test_checkpointing_keeps_parameter_names_and_covers_the_first_blocks():
    from flux_cp.model import FluxDiT

    cfg = parse_config(["--config", str(TINY)], cuda_available=False)
    model = FluxDiT(cfg.model)
    names = [n for n, _ in model.named_parameters()]
    assert apply_checkpointing(model, "full", 0.5) == 2
    assert [n for n, _ in model.named_parameters()] == names  # dumps and state dicts unchanged
    blocks = [*model.double_blocks, *model.single_blocks]
    # the first: their activations live longest
    assert ["forward" in vars(b) for b in blocks] == [True, True, False, False]
    assert apply_checkpointing(FluxDiT(cfg.model), "none") == 0


@pytest.mark.parametrize(("args", "message"), [
    (("--checkpoint-fraction", "0"), "--checkpoint-fraction 0: a share of the blocks in (0, 1]"),
    (("--checkpoint-fraction", "1.5"), "--checkpoint-fraction 1.5: a share of the blocks in (0, 1]"),
    (("--checkpoint-fraction", "0.5"), "--checkpoint-fraction 0.5: with --checkpointing none"),
    (("--checkpointing", "some"), "--checkpointing some: choose one of none, selective, full"),
])
def test_bad_checkpointing_is_one_line(tmp_path, args, message):
    rc, lines = main_in_process("--config", TINY, *args, "--output", tmp_path / "run", "--wandb-mode", "disabled")
    assert rc == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_recompute_flops_are_reported_beside_the_model_flops():
    from flux_cp.measure.flops import hardware_flops_factor

    assert hardware_flops_factor("none", 1.0) == 1.0
    assert hardware_flops_factor("full", 1.0) == pytest.approx(4 / 3)  # a second forward: 4 forwards' work, not 3
    assert hardware_flops_factor("full", 0.5) == pytest.approx(1 + 0.5 / 3)
    assert hardware_flops_factor("selective", 1.0) == 1.0  # the GEMMs and attention kept: no model FLOPs again
    with pytest.raises(ConfigError):
        hardware_flops_factor("sometimes", 1.0)
