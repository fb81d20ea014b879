"""Gradient accumulation (--micro-batches k): a data-parallel group's samples a step run as k micro-batches,
their gradients summed and synced once, one optimizer step. In fp64 that trains as one process at the same global
batch, all of it at once: 10 steps' losses, the first step's gradients and the final weights (conftest.assert_exact;
measured: <= 2.2e-16 on the losses, 2e-15 on the gradients, 4.4e-13 on the parameters). With the sync left on in the
earlier micro-batches DDP and FSDP2 would agree as well (a sum of all-reduces is the all-reduce of the sum) but send
the gradients k times: the ledger's bytes a step are checked; ZeRO-2 would step its optimizer in each backward."""

import pytest

from flux_cp.config import ConfigError, RunConfig
from flux_cp.plan.plans import enumerate_plans, memory_gib
from flux_cp.plan.rank import command

from .conftest import TINY, assert_exact, exact_run, main_in_process
from .test_plan import _cfg

GRAD_BYTES = 8  # fp64


def _synced_once(d: dict, kind: str) -> None:
    """The step's gradient reductions carry the model's gradient once (not once a micro-batch)."""
    assert d["comm"]["per_step"][kind]["bytes"] == d["params"] * GRAD_BYTES


@pytest.mark.parametrize(("args", "micro"), [
    # one process, 4 micro-batches of 1
    (("--devices", 1, "--micro-batches", 4, "--harness", "bare"), 1),
    # W=2 plain data parallelism: each rank 2 samples in 2 micro-batches, DDP's no_sync (bare loop: its wrapper)
    (("--devices", 2, "--cp-degree", 1, "--micro-batches", 2, "--harness", "bare"), 1),
    # the same under Lightning: its DDP wraps the module, the strategy's block_backward_sync skips the sync
    (("--devices", 2, "--cp-degree", 1, "--micro-batches", 2), 1),
    # FSDP2 with its gradient sync off until the last micro-batch
    (("--devices", 2, "--cp-degree", 1, "--micro-batches", 2, "--weights", "fsdp", "--harness", "bare"), 1),
    # ZeRO-2 over a CP group of 2 (each micro-batch of 2 samples split by tokens): its hooks reduce the sum once
    (("--devices", 2, "--cp", "allgather-kv", "--micro-batches", 2, "--weights", "zero2", "--harness",
      "bare"), 2),
])
def test_accumulation_trains_as_one_process_at_the_global_batch(single_process, tmp_path, args, micro):
    got = exact_run(tmp_path, "--data.global_batch", 4, *args)
    d = got["summary"]
    assert d["micro_batch"] == micro and d["throughput"]["samples_per_step"] == 4  # every sample of the step counted
    assert_exact(got, single_process(4), rtol=1e-12)
    if d["cp_degree"] == 1 and d["world_size"] == 2:
        _synced_once(d, {"ddp": "all_reduce", "fsdp": "reduce_scatter"}[d["weights"]])


def test_micro_batches_that_do_not_divide_are_refused_in_one_line(tmp_path):
    rc, lines = main_in_process("--config", TINY, "--devices", 2, "--cp-degree", 1, "--data.global_batch", 4,
                                "--micro-batches", 4, "--output", tmp_path / "run")
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("train_bench.py: error: --micro-batches 4: splits each data-parallel "
                               "group's 2 samples a step") and lines[0].endswith("use one of [1, 2]"), lines
    assert not (tmp_path / "run").exists()


def test_the_step_graph_refuses_accumulation():
    from flux_cp.checks import _check_step_graph

    with pytest.raises(ConfigError, match="^--step-graph: --micro-batches 2: one capture"):
        _check_step_graph(RunConfig(accelerator="gpu", step_graph=True, warmup_steps=12, micro_batches=2))


def test_a_plan_over_the_memory_accumulates_the_fewest_micro_batches_that_fit():
    """dp 2 of B = 8: 4 samples a rank. Under a limit between the estimates at 4 and at 2 samples a forward the plan
    runs 2 micro-batches; the step graph takes none: pruned, saying so."""
    params, cell = 10**6, {"seq_len": 144, "global_batch": 8, "world": 2, "cps": ("none",), "weights": ("ddp",)}
    (p,) = enumerate_plans(_cfg(), **cell, on_gpu=False, params=params)
    cfg = _cfg()
    cfg.data.batch_size = 4  # B / dp
    at = {}
    for k in (1, 2):
        cfg.run.micro_batches = k
        at[k] = memory_gib(cfg, params, p)
    assert p.accumulate == 1 and p.memory_gib == at[1] > at[2]
    limit = (at[1] + at[2]) / 2
    (p,) = enumerate_plans(_cfg(), **cell, on_gpu=False, params=params, memory_gib_limit=limit)
    assert p.pruned is None and p.accumulate == 2 and p.name == "dp2-ddp-eager-acc2" and p.memory_gib == at[2]
    assert "--data.global_batch 8" in command(p, None) and "--micro-batches 2" in command(p, None)
    (g,) = enumerate_plans(_cfg(), **cell, on_gpu=True, params=params, memory_gib_limit=limit, builds=("graph",))
    assert g.pruned.startswith("does not fit: ~") and g.pruned.endswith("(the step graph takes no gradient "
                                                                        "accumulation)")
