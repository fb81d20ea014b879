"""The (dp, cp) mesh, DDP vs FSDP2 weights, several nodes: real gloo runs against one process, fp32.

dp=2 x cp=2 on the tiny config (batch_size 1 per dp rank) must train exactly like one process with
batch_size 2 on the same two samples: losses of both steps (so the sharded AdamW update too) and
every gradient of the first step.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from flux_cp.config import ConfigError, parse_config, resolve
from flux_cp.model import FluxDiT

from .conftest import ROOT, SCRIPT, TINY, bench, free_port

STEPS = ("--steps", 1, "--warmup-steps", 1)  # 2 optimizer steps
COMMON = ("--config", TINY, "--dump-grads", "true", "--wandb-mode", "disabled", *STEPS)


def _load(out):
    return json.loads((out / "summary.json").read_text()), torch.load(out / "grads_step0.pt")


def _run(out, *args):
    r = bench(*COMMON, "--output", out, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return _load(out)


def _assert_same_training(got, ref):
    (d, grads), (d_ref, ref_grads) = got, ref
    assert len(d["loss"]) == len(d_ref["loss"]) == 2
    torch.testing.assert_close(torch.tensor(d["loss"]), torch.tensor(d_ref["loss"]), rtol=1e-5, atol=0)
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-5 * g.abs().max().item(), msg=name)


@pytest.fixture(scope="module")
def batch2(tmp_path_factory):
    """One process, no CP, the two samples as one batch."""
    return _run(tmp_path_factory.mktemp("batch2"), "--devices", 1, "--data.batch_size", 2)


def _tiny_params():
    return list(FluxDiT(parse_config(["--config", str(TINY)]).model).parameters())


@pytest.mark.parametrize("weights", ["ddp", "zero", "fsdp"])
def test_dp2_x_cp2_matches_one_process_on_the_global_batch(batch2, tmp_path, weights):
    got = _run(tmp_path, "--devices", 4, "--cp-degree", 2, "--cp", "allgather-kv", "--weights", weights)
    d = got[0]
    assert (d["world_size"], d["dp"], d["cp_degree"], d["num_nodes"], d["weights"]) == (4, 2, 2, 1, weights)
    assert d["tokens_per_rank"] == 144 // 2 and d["run_name"].startswith("train-W4-dp2-allgather-kv")
    assert d["complete"] and d["metrics"]["step_ms"]["n"] == 1
    if weights == "zero":  # rank 0 stepped its ZeroRedundancyOptimizer share, about a quarter of the parameters
        assert d["params"] / 8 < d["optimizer_params"] < d["params"] / 3
    else:
        assert d["optimizer_params"] == d["params"] or weights == "fsdp"
    _assert_same_training(got, batch2)


def test_two_nodes_on_one_machine_match_one_node(batch2, tmp_path):
    """Two launches with --num-nodes 2 (node ranks 0 and 1, loopback master): Lightning's LightningEnvironment
    joins them into one 4-rank job; CP groups are ranks {0,1} and {2,3}, i.e. one per node."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WANDB_SILENT": "true"}
    env.pop("LOCAL_RANK", None)
    args = [sys.executable, str(SCRIPT), *map(str, COMMON), "--output", str(tmp_path), "--devices", "2",
            "--num-nodes", "2", "--cp-degree", "2", "--weights", "fsdp"]
    nodes = [subprocess.Popen(args, env={**env, "NODE_RANK": str(n)}, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    results = [p.communicate(timeout=300) for p in nodes]
    for p, (_, err) in zip(nodes, results):
        assert p.returncode == 0, err[-3000:]
    got = _load(tmp_path)
    assert (got[0]["world_size"], got[0]["dp"], got[0]["num_nodes"]) == (4, 2, 2)
    _assert_same_training(got, batch2)


BAD = [
    (["--devices", 4, "--cp-degree", 3], {}, "--cp-degree 3: must divide the 4 ranks"),
    (["--devices", 2, "--num-nodes", 2], {"NODE_RANK": "2"}, "--num-nodes 2: this node has NODE_RANK=2"),
]


@pytest.mark.parametrize(("args", "env", "message"), BAD)
def test_bad_mesh_is_one_line_and_exit_2(tmp_path, args, env, message):
    r = bench(*args, "--output", tmp_path, env=env)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--devices", 4, "--cp-degree", 8], {}, "--cp-degree 8: must divide the 4 ranks"),
        (["--devices", 4, "--cp-degree", 4, "--cp", "none"], {}, "--cp none: no context parallelism"),
        (["--devices", 2, "--num-nodes", 2, "--cp-degree", 4, "--cp", "ulysses", "--model.num_heads", 2,
          "--model.head_dim", 32, "--model.rope_axes", "[8, 12, 12]"], {}, "num_heads 2 is not divisible by the CP"),
        (["--devices", 2, "--num-nodes", 2], {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2"},
         "= 4 ranks, but torchrun started WORLD_SIZE=2"),
        (["--num-nodes", 2], {"SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_JOB_NAME": "job"},
         "SLURM_NNODES=1"),
        (["--num-nodes", 1], {"GROUP_RANK": "1"}, "GROUP_RANK=1"),
    ],
)
def test_resolve_rejects_bad_meshes(args, env, message):
    cfg = parse_config(["--config", str(TINY), *map(str, args)], cuda_available=False)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        resolve(cfg, cuda_available=False, gpu_count=0, env=env)


def test_resolve_defaults_to_pure_cp_and_allows_pure_dp():
    cfg = resolve(parse_config(["--config", str(TINY), "--devices", "2", "--num-nodes", "2"], cuda_available=False),
                  cuda_available=False, gpu_count=0, env={"NODE_RANK": "1"})
    assert (cfg.run.cp_degree, cfg.run.dp, cfg.run.cp) == (4, 1, "allgather-kv")
    cfg = resolve(parse_config(["--config", str(TINY), "--devices", "4", "--cp-degree", "1"], cuda_available=False),
                  cuda_available=False, gpu_count=0, env={})
    assert (cfg.run.cp_degree, cfg.run.dp, cfg.run.cp) == (1, 4, "none")
