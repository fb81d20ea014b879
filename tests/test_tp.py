"""--cp tp (flux_cp/parallel/tp.py): Megatron-LM's tensor parallelism with sequence parallelism over the CP group, the
comparator past CP. Real gloo ranks train as the single process over 10 steps in fp64 (losses, first-step gradients
and final parameters, the sharded weights put together from every rank's shard), in the bare loop at W = 2 and 4,
under Lightning, and dp x tp (TP groups, data parallelism across them); a step sends all-gathers and reduce-scatters
of the sequence and the replicated weights' all-reduce, no all-to-all; the simulated rank issues what a real rank
issues."""

import json

import pytest

from .conftest import TINY, assert_exact, bench, exact_run

# the tiny model: 2 double blocks (8 all-gathers + 8 reduce-scatters a step each: attention and FF, image and text
# streams, forward and backward) + 2 single blocks (2 + 2 each) + 7 AdaLN modulation linears (each an all-gather of
# its output forward, a reduce-scatter and an all-reduce backward)
MODULATION = 2 * 2 + 2 + 1
PER_STEP = 2 * 8 + 2 * 2 + MODULATION


# compiled per block (aot_eager: dynamo traces the TP forwards and their collectives, CI's minutes spared inductor's)
COMPILED = ("--compile", "true", "--compile-backend", "aot_eager", "--warmup-steps", 2, "--steps", 8)


# (four ranks: the dp x tp cases below, two TP groups of two)
@pytest.mark.parametrize("devices,harness,extra", [(2, "bare", ()), (2, "lightning", ()),
                                                   pytest.param(2, "bare", COMPILED, marks=pytest.mark.slow)],
                         ids=["w2", "w2-lightning", "w2-compiled"])  # compiled: the slow set (make test-slow, CI)
def test_tp_trains_like_one_process(single_process, tmp_path, devices, harness, extra):
    got = exact_run(tmp_path, "--devices", devices, "--cp", "tp", "--harness", harness, *extra)
    d = got["summary"]
    assert (d["cp"], d["world_size"], d["harness"]) == ("tp", devices, harness)
    assert_exact(got, single_process(1), rtol=1e-12)
    sent = d["comm"]["per_step"]
    assert set(sent) == {"all_gather", "reduce_scatter", "all_reduce"}, sent  # no all-to-all, no broadcast
    assert sent["all_gather"]["count"] == sent["reduce_scatter"]["count"] == PER_STEP
    assert sent["all_reduce"]["count"] > MODULATION  # and DDP's of the replicated weights
    # the dumps: every sharded weight whole again, the same names and shapes as the single process's
    ref = single_process(1)["params"]
    assert {k: v.shape for k, v in got["params"].items()} == {k: v.shape for k, v in ref.items()}


# the Lightning module shards alike (configure_model: w2-lightning)
@pytest.mark.parametrize(("harness", "micro"), [("bare", 1), ("bare", 2)])
def test_tp_groups_with_data_parallelism_across_them_train_like_one_process(single_process, tmp_path, harness, micro):
    """dp x tp: 4 ranks as 2 TP groups of 2, each group its own samples (global batch 2 x micro, in `micro`
    micro-batches). The ranks holding the same shard sum its gradient (one all-reduce a shard and step, whatever
    the micro-batches); DDP averages the replicated weights over all 4. 10 steps of the one-process model, fp64."""
    got = exact_run(tmp_path, "--devices", 4, "--cp", "tp", "--cp-degree", 2, "--data.global_batch", 2 * micro,
                    "--micro-batches", micro, "--harness", harness)
    d = got["summary"]
    assert (d["dp"], d["cp_degree"], d["config"]["data"]["batch_size"]) == (2, 2, micro)
    assert_exact(got, single_process(2 * micro), rtol=1e-12)
    sent = d["comm"]["per_step"]
    assert sent["all_gather"]["count"] == sent["reduce_scatter"]["count"] == PER_STEP * micro  # within the TP group
    # every gradient synced once a step: the rank's own parameters (its shards and the replicated ones), fp64, and
    # kilobytes of the AdaLN outputs' adjoint within the TP group each micro-batch (0.2%); a sync in every
    # micro-batch's backward would send 1.9x
    assert d["params"] * 8 <= sent["all_reduce"]["bytes"] < 1.01 * d["params"] * 8, sent["all_reduce"]


def test_a_simulated_tp_rank_issues_a_real_ranks_collectives(tmp_path):
    """Rank 0 of W=2 over torch's fake group (what the H200 suites run) sends what a real gloo rank sends."""
    runs = {}
    for name, args in (("real", ("--devices", 2)), ("sim", ("--simulate-world", 2))):
        r = bench("--config", TINY, "--cp", "tp", "--harness", "bare", "--wandb-mode", "disabled", "--steps", 4,
                  "--output", tmp_path / name, *args)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert runs["sim"]["collectives"] == "fake"
    assert runs["sim"]["comm"]["per_step"] == runs["real"]["comm"]["per_step"]


@pytest.mark.parametrize("args,message", [
    (("--weights", "zero2"), "--cp tp: its weights are sharded by heads and MLP features"),
    (("--split-conditioning", "true"), "--split-conditioning does not combine with it"),
    (("--model.num_heads", 6), "--model.num_heads 6 is not divisible by"),
    (("--model.mlp_ratio", 3.03125), "--model.mlp_ratio 3.03125: the MLP's 194 features are not divisible"),
    (("--ops-only",), "--cp tp: its attention is Ulysses'"),
])
def test_bad_tp_settings_are_one_line(tmp_path, args, message):
    r = bench("--config", TINY, "--cp", "tp", "--devices", 4, "--wandb-mode", "disabled", "--output", tmp_path / "o",
              *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_tp_with_separate_q_k_v_projections_trains_like_one_process(tmp_path):
    """Without fused projections (diffusers' to_q, to_k, to_v and add_*_proj, each sharded by heads): W=2 as one
    process of the same model."""
    unfused = ("--model.fuse_qkv", "false")
    ref = exact_run(tmp_path / "one", "--devices", 1, *unfused)
    got = exact_run(tmp_path / "tp", "--devices", 2, "--cp", "tp", "--harness", "bare", *unfused)
    assert_exact(got, ref, rtol=1e-12)


def test_the_bare_loops_wrap_shards_the_weights_for_ddp(tmp_path):
    """train.bare.wrap_for_training (the bare loop's, and the Lightning run's bare twin's, which builds a model of
    its own: callbacks/twin.py) shards a --cp tp model over the CP mesh before DDP wraps it, and DDP holds only the
    replicated weights. Rank 0 of a fake group of 2."""
    import torch

    from flux_cp.config import parse_config
    from flux_cp.parallel.fake_group import init_fake_world
    from flux_cp.parallel.mesh import build_mesh
    from flux_cp.train.bare import wrap_for_training
    from flux_cp.train.step import build_model

    cfg = parse_config(["--config", str(TINY), "--cp", "tp", "--simulate-world", "2", "--harness", "bare"],
                       cuda_available=False)
    init_fake_world(2)
    try:
        model = build_model(cfg)
        mesh = build_mesh("cpu", 1, 2)
        ddp, _ = wrap_for_training(model, cfg.run, torch.device("cpu"), mesh["cp"])
        d = cfg.model.hidden
        assert model.single_blocks[0].attn.to_qkv.weight.shape == (3 * d // 2, d)  # this rank's heads' rows
        assert model.single_blocks[0].proj_out.weight.shape == (d, (d + int(d * cfg.model.mlp_ratio)) // 2)
        ignored = ddp.parameters_to_ignore
        named = dict(ddp.module.named_parameters())
        assert ignored and all(hasattr(named[n], "_tp") for n in ignored)  # DDP leaves every shard alone
        assert not any(hasattr(p, "_tp") for n, p in named.items() if n not in ignored)
    finally:
        import torch.distributed as dist

        dist.destroy_process_group()


def test_a_single_block_keeps_its_gathered_sequence_once(tmp_path):
    """At batch > 1 the all-gathered (B, S, D) is a strided view; each linear reading it (a single block's qkv and
    MLP) copied it and kept its copy for the backward: two a block (found on an H100 at Flux.1's depth). Rank 0 of
    a fake group of 2, batch 2: the saved full-sequence hidden states are one storage a single block."""
    import torch
    import torch.distributed as dist

    from flux_cp.config import parse_config
    from flux_cp.data import device_batches
    from flux_cp.measure.timing import StepTimer
    from flux_cp.parallel.fake_group import init_fake_world
    from flux_cp.parallel.mesh import build_mesh
    from flux_cp.train.bare import wrap_for_training
    from flux_cp.train.step import FluxStep, build_model

    cfg = parse_config(["--config", str(TINY), "--cp", "tp", "--simulate-world", "2", "--harness", "bare",
                        "--data.batch_size", "2", "--output", str(tmp_path)], cuda_available=False)
    init_fake_world(2)
    try:
        cpu = torch.device("cpu")
        model = build_model(cfg)
        mesh = build_mesh("cpu", 1, 2)
        fwd, opt = wrap_for_training(model, cfg.run, cpu, mesh["cp"])
        step = FluxStep(cfg, model, cpu, mesh["cp"], StepTimer(cuda=False, enabled=False))
        (batch,) = device_batches(cfg.data, cfg.model, 1, 0, 1, torch.float32, cpu)
        full = 2 * cfg.data.seq_len * cfg.model.hidden  # (B, S, D), or (B * S, D) as a linear keeps it
        saved = set()

        def pack(t):  # only a single block's gathered input is the whole sequence's hidden states
            if t.numel() == full and t.shape[-1] == cfg.model.hidden:
                saved.add(t.untyped_storage().data_ptr())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step(fwd, opt, batch)
        assert len(saved) == cfg.model.single_blocks
    finally:
        dist.destroy_process_group()
