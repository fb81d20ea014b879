"""HSDP on paper (predict/hsdp.py, tools/hsdp_plan.py): n nodes x 8 GPUs priced from a simulated W = 8 FSDP rank.
A real tiny run gives the ledger FSDP2 issues; a hand-made one gives figures priced by hand."""

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest

from flux_cp.predict import hsdp
from flux_cp.predict.links import KindLink, LinkProfile, flat, load
from flux_cp.predict.step_model import predict_ledger
from flux_cp.runs.throughput import ranked_throughput, throughput_of

from .conftest import ROOT, TINY, bench

TIERS = hsdp.two_tier("h200-nvlink4", "ib-ndr")


@pytest.fixture(scope="module")
def fsdp8(tmp_path_factory) -> Path:
    """A simulated rank 0 of tiny FSDP at W = 8 (pure data parallelism), two measured steps in its ledger."""
    out = tmp_path_factory.mktemp("hsdp") / "fsdp8"
    r = bench("--config", TINY, "--warmup-steps", 1, "--steps", 2, "--regions-every", 1, "--cp", "none",
              "--cp-degree", 1, "--weights", "fsdp", "--simulate-world", 8, "--output", out, "--wandb-mode", "disabled")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _gpu(d: dict) -> dict:
    """The run as if a simulated H100 rank in bf16 (peak FLOPs known: MFU; ranked_throughput prices it)."""
    cfg = d["config"] | {"run": d["config"]["run"] | {"precision": "bf16-true"}}
    return d | {"config": cfg, "env": d["env"] | {"device": "NVIDIA H100 80GB HBM3"}}


def _hand(rs_bytes=8e9, issue=90.0, blocking=True) -> dict:
    """Step 100 ms (forward to 30, backward to 90): one reduce-scatter of rs_bytes over 8 ranks."""
    rec = {"step": 1, "kind": "timed", "step_ms": 100.0, "phases": {"forward_end_ms": 30.0, "backward_end_ms": 90.0},
           "collectives": [{"kind": "reduce_scatter", "bytes": rs_bytes, "group_size": 8, "issue_ms": issue,
                            "async": not blocking, "wait_ms": None, "stream": "compute"}]}
    return {"run_name": "hand", "weights": "fsdp", "world_size": 8, "cp": "none", "collectives": "fake",
            "config": {"run": {}}, "metrics": {"step_ms": {"median": 100.0}}, "comm": {"ledger": [rec]},
            "throughput": {"tokens_per_step": 8000, "model_flops_per_step": 8e15, "peak_flops": 1e15}}


def test_one_node_is_the_w8_prediction_itself(fsdp8):
    d = _gpu(json.loads((fsdp8 / "summary.json").read_text()))
    ledger = d["comm"]["ledger"]
    (one,) = hsdp.plan(d, ledger, TIERS, nodes=(1,), work=throughput_of(d))
    ref = predict_ledger(ledger, TIERS.intra, step_ms=d["metrics"]["step_ms"]["median"])
    ranked = ranked_throughput(d, ledger, TIERS.intra)
    for r in (one.hsdp, one.fsdp):
        assert (r.step_ms, r.exposed_comm_ms) == (ref.predicted_ms, ref.exposed_ms)
        assert (r.step_ms, r.exposed_comm_ms) == (ranked["step_ms"], ranked["exposed_comm_ms"])
        assert r.tokens_per_s_per_gpu == pytest.approx(ranked["tokens_per_s_per_gpu"], rel=1e-12)
        assert r.mfu == pytest.approx(ranked["mfu"], rel=1e-12) and r.mfu > 0
        assert r.cross_node_bytes == 0


def test_hsdp_moves_an_eighth_of_the_gradients_across_nodes_and_exposes_less(fsdp8):
    d = json.loads((fsdp8 / "summary.json").read_text())
    ledger = d["comm"]["ledger"]
    scattered = {sum(c["bytes"] for c in r["collectives"] if c["kind"] == "reduce_scatter") for r in ledger}
    (grad,) = scattered  # every measured step reduce-scatters every gradient once
    assert grad == pytest.approx(d["params"] * 4, rel=0.01)  # fp32 gradients (FSDP2 pads a shard's rows at most)
    for p in hsdp.plan(d, ledger, TIERS, nodes=(2, 4, 8)):
        assert p.hsdp.cross_node_bytes == grad / 8
        assert p.fsdp.cross_node_bytes > 8 * p.hsdp.cross_node_bytes  # every all-gather and reduce-scatter, whole
        assert p.hsdp.exposed_comm_ms <= p.fsdp.exposed_comm_ms and p.hsdp.step_ms <= p.fsdp.step_ms
        assert p.hsdp.tokens_per_s_per_gpu >= p.fsdp.tokens_per_s_per_gpu


def test_hand_priced_all_reduce_after_the_last_reduce_scatter():
    """intra 1000 GB/s: the blocking reduce-scatter of 8 GB costs 8e9 x 7/8 / 1e12 = 7 ms; its 1 GB shard's all-reduce
    over 2 nodes at 10 GB/s, 1e9 x 1 / 1e10 = 100 ms, starts at the backward's end: all of it exposed. Plain FSDP at
    W = 16 reduce-scatters the 8 GB at 10 GB/s: 8e9 x 15/16 / 1e10 = 750 ms."""
    d = _hand()
    (p,) = hsdp.plan(d, d["comm"]["ledger"], hsdp.TwoTier(flat(1000.0), flat(10.0)), nodes=(2,))
    assert (p.hsdp.step_ms, p.hsdp.exposed_comm_ms) == pytest.approx((207.0, 107.0))
    assert (p.fsdp.step_ms, p.fsdp.exposed_comm_ms) == pytest.approx((850.0, 750.0))
    assert p.hsdp.cross_node_bytes == 1e9 and p.fsdp.cross_node_bytes == 8e9
    assert p.hsdp.tokens_per_s_per_gpu == pytest.approx(8000 / 0.207 / 8)
    assert p.hsdp.mfu == pytest.approx(8e15 / 0.207 / 8 / 1e15)
    # early in the backward the same all-reduce hides under the 70 ms of compute left: only 30 ms of it waits
    d = _hand(issue=40.0)  # 50 ms of backward left
    (p,) = hsdp.plan(d, d["comm"]["ledger"], hsdp.TwoTier(flat(1000.0), flat(10.0)), nodes=(2,))
    assert (p.hsdp.step_ms, p.hsdp.exposed_comm_ms) == pytest.approx((157.0, 57.0))


def _slower(prof: LinkProfile, k: float) -> LinkProfile:
    kinds = {n: KindLink(v.latency_us * k, v.busbw_gbps / k, v.source) for n, v in prof.kinds.items()}
    return LinkProfile(f"{prof.name}/{k:g}", kinds)


@pytest.mark.parametrize("blocking", [True, False])
def test_a_slower_inter_node_link_never_makes_a_step_faster(fsdp8, blocking):
    runs = [json.loads((fsdp8 / "summary.json").read_text()), _hand(rs_bytes=2e9, issue=60.0, blocking=blocking)]
    for d in runs:
        steps = []
        for k in (0.5, 1, 2, 4, 16, 256, 1e6):
            plans = hsdp.plan(d, d["comm"]["ledger"], hsdp.TwoTier(TIERS.intra, _slower(TIERS.inter, k)), (2, 8))
            steps.append([(p.hsdp.step_ms, p.fsdp.step_ms) for p in plans])
        for a, b in zip(steps, steps[1:]):
            assert all(x2 >= x1 for p1, p2 in zip(a, b) for x1, x2 in zip(p1, p2)), steps
        # a million times slower, even the all-reduces hidden under a slow CPU's backward (CI: 766 ms steps) show
        assert steps[-1][0][0] > steps[0][0][0]


def _tool():
    spec = importlib.util.spec_from_file_location("hsdp_plan", ROOT / "tools" / "hsdp_plan.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = _tool().main(list(map(str, argv)))
    return rc, out.getvalue(), err.getvalue()


def test_the_tool_prints_a_table_and_json(fsdp8):
    rc, out, _ = _cli(fsdp8, "--nodes", "2,4")
    assert rc == 0 and "HSDP" in out and "FSDP" in out and "ib-ndr" in out
    rc, out, _ = _cli(fsdp8, "--nodes", "2", "--json")
    j = json.loads(out)
    assert rc == 0 and [p["nodes"] for p in j["plans"]] == [2] and j["plans"][0]["world"] == 16
    assert j["plans"][0]["hsdp"]["step_ms"] <= j["plans"][0]["fsdp"]["step_ms"]


def _write(folder: Path, d: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(d))
    return folder


@pytest.mark.parametrize("change, args, named", [
    ({"weights": "ddp"}, (), "--weights ddp"),
    ({"world_size": 4}, (), "W=4"),
    ({"collectives": None}, (), "a real W=8 run"),
    ({"cp": "allgather-kv"}, (), "--cp allgather-kv"),
    ({"comm": {}}, (), "comm.ledger"),
    ({}, ("--nodes", "2,x"), "--nodes 2,x"),
    ({}, ("--nodes", "0"), "--nodes 0"),
    ({}, ("--inter", "no-such-link"), "--inter no-such-link"),
    (None, (), "RUN_DIR"),
])
def test_bad_input_is_one_line_naming_the_setting_and_exit_2(tmp_path, change, args, named):
    folder = tmp_path / "missing" if change is None else _write(tmp_path / "run", _hand() | change)
    rc, out, err = _cli(folder, *args)
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert err.startswith("hsdp_plan.py: error: ") and named in err and "(" in err  # the fix in parentheses


def test_profiles_load_by_name_and_price_by_group_size():
    assert TIERS.intra.name == load("h200-nvlink4").name and TIERS.name == "h200-nvlink4 + ib-ndr"
    assert TIERS.price_ms("all_gather", 1e9, 8) == TIERS.intra.price_ms("all_gather", 1e9, 8)
    assert TIERS.price_ms("all_gather", 1e9, 16) == TIERS.inter.price_ms("all_gather", 1e9, 16)
