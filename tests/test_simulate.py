"""A simulated rank is the real code: one process as rank 0 of a W-rank job over torch's fake process group
(parallel/fake_group.py) computes what rank 0 of a real gloo job of the same config computes, and issues the same
collectives (measure/ledger.py). Each pair: the real run (Lightning launches W gloo ranks) and the simulated one,
tiny config, 1 warm-up + 1 measured step, the measured step's compute ops recorded (--dump-ops)."""

import difflib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flux_cp.runs.results import validate

from .conftest import TINY, bench
from .wandb_records import run_info

# --regions-every 1: the one measured step is instrumented (the ledger records there only)
COMMON = ("--config", TINY, "--warmup-steps", 1, "--steps", 1, "--dump-ops", "true", "--regions-every", 1)
PAIRS = {  # name: (W, the run's settings): every strategy, weights mode and --split-conditioning, W = 2 and 4
    "ulysses-zero-splitcond": (2, ("--cp", "ulysses", "--weights", "zero", "--split-conditioning", "true")),
    "agkv-fsdp": (2, ("--cp", "allgather-kv", "--weights", "fsdp")),
    "dp2xcp2-agkv-ddp": (4, ("--cp", "allgather-kv", "--cp-degree", 2)),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Every run of every pair at once (each its own process group): their start-ups overlap on the 2 cores."""
    with ThreadPoolExecutor(2 * len(PAIRS)) as pool:
        jobs = {}
        for name, (w, args) in PAIRS.items():
            root = tmp_path_factory.mktemp(name)
            wandb = ("--wandb-mode", "offline") if name == "ulysses-zero-splitcond" else ("--wandb-mode", "disabled")
            jobs[name, "sim"] = pool.submit(bench, *COMMON, *args, "--simulate-world", w, "--output", root / "sim",
                                            *wandb)
            jobs[name, "real"] = pool.submit(bench, *COMMON, *args, "--devices", w, "--output", root / "real",
                                             "--wandb-mode", "disabled")
        out = {}
        for (name, kind), job in jobs.items():
            r = job.result()
            assert r.returncode == 0, r.stderr[-3000:]
            out.setdefault(name, {})[kind] = Path(r.args[r.args.index("--output") + 1])
    return out


def _summary(folder):
    return json.loads((folder / "summary.json").read_text())


def _ops(folder):
    return [json.dumps(op) for op in json.loads((folder / "ops_rank0.json").read_text())]


@pytest.mark.parametrize("name", PAIRS)
def test_simulated_rank_computes_what_real_rank_0_computes(pairs, name):
    """The same aten compute ops, in the same order, with the same shapes and dtypes. The one difference gloo
    adds: after a reduce-scatter it copies its result into the output (split + copy_, in the caller's thread)."""
    sim, real = _ops(pairs[name]["sim"]), _ops(pairs[name]["real"])
    assert len(sim) > 500
    extra = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, sim, real, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        assert tag == "insert", f"{tag}: simulated {sim[i1:i2][:4]} vs real {real[j1:j2][:4]}"
        extra += [json.loads(op)[0] for op in real[j1:j2]]
    assert set(extra) <= {"aten::split.Tensor", "aten::copy_"}, extra
    scatters = _summary(pairs[name]["real"])["comm"]["per_step"].get("reduce_scatter", {}).get("count", 0)
    assert extra.count("aten::split.Tensor") <= scatters


@pytest.mark.parametrize("name", PAIRS)
def test_simulated_ledger_equals_real_rank_0(pairs, name):
    """Kind, bytes, group size and blocking of every collective of the measured step, in issue order."""
    sim, real = (_summary(pairs[name][k]) for k in ("sim", "real"))

    def key(d):
        (step,) = d["comm"]["ledger"]
        return [(e["kind"], e["bytes"], e["group_size"], e["async"]) for e in step["collectives"]]

    assert key(sim) == key(real) and len(key(sim)) > 0
    assert sim["comm"]["per_step"] == real["comm"]["per_step"]
    (step,) = sim["comm"]["ledger"]
    phases = step["phases"]
    assert 0 < phases["forward_end_ms"] < phases["backward_end_ms"] < step["step_ms"]
    assert all(0 <= e["issue_ms"] <= step["step_ms"] for e in step["collectives"])


def test_simulated_run_says_so(pairs):
    """summary.json, its validation and the wandb run: simulated, W and the rank; no job losses to compare (the
    rank's own, rank_loss, only for A/B checks of one configuration)."""
    d, real = _summary(pairs["ulysses-zero-splitcond"]["sim"]), _summary(pairs["ulysses-zero-splitcond"]["real"])
    assert validate(d) == [] and validate(real) == []
    assert (d["collectives"], d["simulate"], d["world_size"]) == ("fake", {"world": 2, "rank": 0}, 2)
    assert (real["collectives"], real["simulate"]) == ("real", None)
    assert d["loss"] is None and len(real["loss"]) == 2 and len(d["rank_loss"]) == 2 and "rank_loss" not in real
    assert d["run_name"].startswith("train-W2sim-ulysses-zero-splitcond")
    assert d["optimizer_params"] == real["optimizer_params"] < d["params"]  # rank 0's own ZeRO share
    (log,) = (pairs["ulysses-zero-splitcond"]["sim"] / "wandb").glob("offline-run-*/run-*.wandb")
    cfg = run_info(log)["config"]
    assert (cfg["collectives"], cfg["simulate"]) == ("fake", {"world": 2, "rank": 0})


def test_simulated_rank_r(tmp_path):
    """--simulate-rank 3 of 4: rank 3's data, its own output and logs (Lightning's broadcasts of Python objects
    would hand it garbage from the fake group: they return its own objects)."""
    r = bench("--config", TINY, "--warmup-steps", 1, "--steps", 1, "--cp", "allgather-kv", "--simulate-world", 4,
              "--simulate-rank", 3, "--output", tmp_path, "--wandb-mode", "disabled")
    assert r.returncode == 0, r.stderr[-3000:]
    d = _summary(tmp_path)
    assert d["simulate"] == {"world": 4, "rank": 3} and d["run_name"].startswith("train-W4simr3-")
    assert "simulated: rank 3 of a 4-rank job" in r.stdout


@pytest.mark.slow  # compiles on the CPU (dynamo, inductor or aot_eager): the slow set (make test-slow, CI)
@pytest.mark.parametrize("cp", ["ulysses", "allgather-kv", "ulysses-overlap"])
def test_compiled_blocks_issue_the_eager_twins_collectives(tmp_path, cp):
    """Issue 26: a compiled recipe's communication is priced from the same ledger as its eager twin's. Each block
    under torch.compile (AOT autograd's graphs; aot_eager: inductor's CPU codegen would add minutes, the traced
    collectives are the same), rank 0 of a simulated 2-rank job with ZeRO: every step's collectives as eager's, kind
    for kind and byte for byte, but for how DDP splits the same gradient bytes into buckets (it rebuilds them in the
    order gradients become ready, which compiled blocks change). ulysses-overlap: --ulysses-overlap's all-to-alls,
    issued and awaited apart (the order in the compiled graphs: tests/test_overlap.py)."""
    overlap = ("--ulysses-overlap", "true") if cp == "ulysses-overlap" else ()
    cp = cp.removesuffix("-overlap")
    common = ("--config", TINY, "--simulate-world", 2, "--cp", cp, *overlap, "--weights", "zero", "--warmup-steps", 2,
              "--steps", 2, "--regions-every", 1, "--harness", "bare", "--compile-backend", "aot_eager",
              "--wandb-mode", "disabled")  # --regions-every 1: the ledger in both measured steps
    with ThreadPoolExecutor(2) as pool:
        jobs = {c: pool.submit(bench, *common, "--compile", c, "--output", tmp_path / c) for c in ("false", "true")}
        for c, job in jobs.items():
            r = job.result()
            assert r.returncode == 0, (c, r.stderr[-3000:])
    eager, compiled = (_summary(tmp_path / c) for c in ("false", "true"))
    assert compiled["compile"]["enabled"] and not eager["compile"]["enabled"]

    def key(d):  # per step: the sorted collectives but DDP's, and DDP's all-reduce bytes in total
        return [(sorted((e["kind"], e["bytes"], e["group_size"]) for e in s["collectives"]
                        if e["kind"] != "all_reduce"),
                 sum(e["bytes"] for e in s["collectives"] if e["kind"] == "all_reduce")) for s in d["comm"]["ledger"]]

    assert key(compiled) == key(eager) and len(key(eager)) == 2
    kv = "all_to_all" if cp == "ulysses" else "all_gather"
    assert {kv, "broadcast"} <= {k for k, *_ in key(eager)[0][0]} and key(eager)[0][1] > 0
    if overlap:  # eager, per step: the 2 single blocks' 2 all-to-alls each way, awaited apart from their issue
        apart = [[e["wait_ms"] > e["issue_ms"] for e in s["collectives"] if e["kind"] == "all_to_all" and e["async"]]
                 for s in eager["comm"]["ledger"]]  # (compiled, dynamo makes every all-to-all a functional one)
        assert apart == [[True] * 8] * 2, apart


def test_ulysses_sends_q_k_v_in_one_all_to_all(tmp_path):
    """--ulysses-qkv fused (the default): q, k and v go to their head groups in one all-to-all, so a step issues half
    the all-to-alls of `separate` (in: 1 instead of 3, out: 1, each direction) with the same bytes; rank 0 of a
    simulated 2-rank job, the ledger in both measured steps. (Each trains as one process: tests/test_numerics.py.)"""
    common = ("--config", TINY, "--simulate-world", 2, "--cp", "ulysses", "--warmup-steps", 1, "--steps", 2,
              "--regions-every", 1, "--harness", "bare", "--wandb-mode", "disabled")
    with ThreadPoolExecutor(2) as pool:
        jobs = {q: pool.submit(bench, *common, "--ulysses-qkv", q, "--output", tmp_path / q)
                for q in ("fused", "separate")}
        for q, job in jobs.items():
            r = job.result()
            assert r.returncode == 0, (q, r.stderr[-3000:])
    sent = {q: _summary(tmp_path / q)["comm"]["per_step"]["all_to_all"] for q in ("fused", "separate")}
    assert sent["fused"]["bytes"] == sent["separate"]["bytes"] > 0
    assert 2 * sent["fused"]["count"] == sent["separate"]["count"]
