"""predict.py on hand-made timelines and ledgers, links.py's pricing and fit (no processes, milliseconds)."""

import random

import pytest

from flux_cp.predict.links import KindLink, LinkProfile, bus_factor, fit, for_world, load, load_any, save
from flux_cp.predict.step_model import Collective, Timeline, approximate_ledger, place_fsdp, predict, predict_ledger

# 1 GB/s bus bandwidth and no latency: a 1 MB all-reduce over 2 ranks carries 1 MB of bus bytes = 1 ms
LINK = LinkProfile("test", {k: KindLink(0.0, 1.0) for k in ("all_reduce", "all_to_all", "all_gather", "send",
                                                            "broadcast", "reduce_scatter")})
MB = 1e6
TL = Timeline(step_ms=100.0, forward_end_ms=30.0, backward_end_ms=90.0)


def test_price_follows_nccl_tests_busbw():
    lat = LinkProfile("l", {"all_reduce": KindLink(10.0, 100.0)})
    assert lat.price_ms("all_reduce", 1e9, 8) == pytest.approx(0.010 + 1e9 * 2 * 7 / 8 / 100e9 * 1e3)
    assert lat.price_ms("all_reduce", 1e9, 1) == 0.0  # one rank moves nothing
    assert bus_factor("all_gather", 4) == 0.75 and bus_factor("send", 4) == 1.0


def test_fully_hidden_all_reduce_costs_nothing():
    c = Collective("all_reduce", MB, 2, issue_ms=40.0, is_async=True)  # 1 ms, consumed at backward's end (90)
    p = predict(TL, [c], LINK)
    assert p.predicted_ms == 100.0 and p.exposed_ms == 0.0 and p.upper_ms == pytest.approx(101.0)


def test_blocking_all_to_all_costs_exactly_its_price():
    c = Collective("all_to_all", 6 * MB, 4, issue_ms=10.0)  # 6 MB x 3/4 = 4.5 ms
    p = predict(TL, [c], LINK)
    assert p.predicted_ms == pytest.approx(104.5) and p.exposed_ms_by_kind == {"all_to_all": pytest.approx(4.5)}
    # an async one awaited where it is issued is the same thing
    c.is_async, c.wait_ms = True, 10.0
    assert predict(TL, [c], LINK).predicted_ms == pytest.approx(104.5)


def test_bucket_that_outlasts_the_backward_exposes_the_difference():
    c = Collective("all_reduce", 10 * MB, 2, issue_ms=85.0, is_async=True)  # 10 ms, 5 ms of backward left
    p = predict(TL, [c], LINK)
    assert p.predicted_ms == pytest.approx(105.0) and p.exposed_ms == pytest.approx(5.0)
    # an explicit wait position wins over the phase's end
    c.wait_ms = 95.0
    assert predict(TL, [c], LINK).predicted_ms == pytest.approx(100.0)


def test_serial_comm_stream_and_delays_carry_forward():
    # a blocking all-to-all (2 ms at 10) delays the compute, so the bucket issued at 88 starts at 90 and ends
    # at 94 against backward's end, now at 92: 2 ms more exposed
    colls = [Collective("all_to_all", 4 * MB, 2, 10.0), Collective("all_reduce", 4 * MB, 2, 88.0, True)]
    p = predict(TL, colls, LINK)
    assert p.predicted_ms == pytest.approx(104.0)
    assert p.exposed_ms_by_kind == {"all_to_all": pytest.approx(2.0), "all_reduce": pytest.approx(2.0)}
    # a blocking collective queued behind an async one waits for both: the stall is charged to each
    colls = [Collective("all_reduce", 3 * MB, 2, 50.0, True), Collective("all_to_all", 2 * MB, 2, 51.0)]
    p = predict(TL, colls, LINK)  # the all-reduce runs 50-53, the all-to-all 53-54: compute stalls 51-54
    assert p.predicted_ms == pytest.approx(103.0)
    assert p.exposed_ms_by_kind == {"all_reduce": pytest.approx(2.0), "all_to_all": pytest.approx(1.0)}


def test_bounds_hold_on_random_ledgers():
    rng = random.Random(0)
    kinds = ("all_reduce", "all_to_all", "all_gather", "send", "broadcast")
    for _ in range(300):
        colls = []
        for _ in range(rng.randint(0, 12)):
            t = rng.uniform(0, 100)
            wait = rng.choice([None, min(100.0, t + rng.uniform(0, 30))])
            colls.append(Collective(rng.choice(kinds), rng.uniform(0, 20) * MB, rng.choice([2, 4, 8]), t,
                                    rng.random() < 0.5, wait))
        p = predict(TL, colls, LINK)
        assert p.lower_ms - 1e-9 <= p.predicted_ms <= p.upper_ms + 1e-9
        assert p.predicted_ms == pytest.approx(p.lower_ms + p.exposed_ms)


def test_ledger_records_and_their_median():
    recs = [{"step": s, "step_ms": 100.0 + s, "phases": {"forward_end_ms": 30.0, "backward_end_ms": 90.0},
             "collectives": [{"kind": "all_to_all", "bytes": 2 * MB, "group_size": 2, "async": False,
                              "issue_ms": 5.0, "wait_ms": None, "stream": "compute"}]} for s in range(3)]
    p = predict_ledger(recs, LINK)
    assert p.predicted_ms == pytest.approx(102.0)  # the middle record: 101 + 1 ms
    p = predict_ledger(recs, LINK, step_ms=50.0)  # rescaled to the run's median step
    assert p.lower_ms == 50.0 and p.predicted_ms == pytest.approx(51.0)
    # as the timing callback writes them: phase names without _ms, a probe step (busy time) left out, and a
    # ring step's recv beside its send priced once
    rec = {"step": 5, "kind": "timed", "step_ms": 100.0, "phases": {"forward_end": 30.0, "backward_end": 90.0},
           "collectives": [{"kind": k, "bytes": 2 * MB, "group_size": 2, "async": True, "issue_ms": 80.0,
                            "wait_ms": None, "stream": "compute"} for k in ("send", "recv")]}
    probe = {**rec, "kind": "probe", "step_ms": 10.0}
    p = predict_ledger([rec, probe], LINK)
    assert p.lower_ms == 100.0 and p.comm_ms == pytest.approx(2.0) and p.predicted_ms == 100.0


def _summary(cp, weights="ddp", rotate="allgather"):
    return {"cp": cp, "weights": weights, "params": 1e6, "metrics": {"step_ms": {"median": 100.0}},
            "config": {"model": {"num_heads": 4, "head_dim": 16, "double_blocks": 2, "single_blocks": 2},
                       "data": {"image_height": 12, "image_width": 8, "text_tokens": 48, "batch_size": 1},
                       "run": {"precision": "32-true", "rotate": rotate}}}


def test_approximate_ledger_matches_the_strategies_bytes():
    bhsd = 1 * 4 * 144 * 16 * 4
    tl, colls = approximate_ledger(_summary("allgather-kv"), 2)
    assert tl.step_ms == 100.0 and tl.forward_end_ms < tl.backward_end_ms < 100.0
    ag = [c for c in colls if c.kind == "all_gather"]
    assert len(ag) == 4 and all(c.bytes == 2 * bhsd and not c.is_async for c in ag)
    ar = [c for c in colls if c.kind == "all_reduce"]
    assert sum(c.bytes for c in ar) == pytest.approx(4e6) and all(c.is_async for c in ar)
    assert ar[0].bytes == 2**20 and len(ar) == 2  # DDP's 1 MiB first bucket, then the rest
    _, colls = approximate_ledger(_summary("ulysses", "zero"), 4)
    assert sum(c.kind == "all_to_all" for c in colls) == 4 * 2 * 4
    assert sum(c.bytes for c in colls if c.kind == "broadcast") == pytest.approx(4e6)
    _, colls = approximate_ledger(_summary("torch", rotate="alltoall"), 4)
    assert sum(c.kind == "send" for c in colls) == 4 * (3 + 6) and all(c.is_async for c in colls)
    assert approximate_ledger(_summary("none"), 1)[1] == []


def test_fit_recovers_latency_and_bandwidth():
    sizes = [2 ** k for k in range(10, 31, 2)]
    times = [0.02 + s * 0.5 / 5e9 * 1e3 for s in sizes]  # 20 us + all_gather over 2 ranks at 5 GB/s busbw
    lat, bw = fit(sizes, times, "all_gather", 2)
    assert lat == pytest.approx(20.0, rel=1e-6) and bw == pytest.approx(5.0, rel=1e-6)


def test_shipped_profiles_load_with_sources():
    for name in ("h200-nvlink4", "pcie-gen4", "ib-ndr"):
        p = load(name)
        assert set(p.kinds) >= {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send"}
        assert all(k.source for k in p.kinds.values())
    assert load("h200-nvlink4").kinds["all_reduce"].busbw_gbps == 370


def test_profiles_per_group_size(tmp_path):
    for w, bw in ((2, 1.0), (4, 2.0)):
        p = load("h200-nvlink4")
        p.name, p.kinds["all_reduce"].busbw_gbps = f"g{w}", bw
        save(p, tmp_path / f"gloo-w{w}.yaml")
    per = load_any(str(tmp_path / "gloo-w{W}.yaml"))
    assert sorted(per) == [2, 4] and for_world(per, 4).name == "g4" and for_world(per, 8).name == "g4"
    assert for_world(per, 3).name == "g2"  # equally near: the smaller W
    assert for_world(LINK, 8) is LINK


def test_a_simulated_gpu_rank_is_ranked_at_its_priced_step():
    """runs.throughput.ranked_throughput (wandb's ranking): a simulated GPU rank's tokens/s at its step plus the
    communication its ledger exposes on the link; a real run's, and a CPU rank's (no profile), at the step itself."""
    from flux_cp.predict.links import flat
    from flux_cp.runs.throughput import ranked_throughput

    cfg = {"model": {"num_heads": 4, "head_dim": 16, "double_blocks": 2, "single_blocks": 2, "in_channels": 16,
                     "text_dim": 32, "pooled_dim": 16, "rope_axes": [4, 6, 6]},
           "data": {"image_height": 12, "image_width": 8, "text_tokens": 48, "batch_size": 1},
           "run": {"precision": "bf16-true"}}
    # one blocking all-reduce of 1 GB at 100 GB/s bus, 2 ranks: 2 x 1/2 x 1e9 B / 1e11 B/s = 10 ms exposed
    ledger = [{"step": 1, "kind": "timed", "step_ms": 20.0, "phases": {},
               "collectives": [{"kind": "all_reduce", "bytes": 1e9, "group_size": 2, "issue_ms": 5.0,
                                "async": False, "wait_ms": None}]}]
    sim = {"config": cfg, "world_size": 2, "dp": 1, "collectives": "fake", "metrics": {"step_ms": {"median": 20.0}},
           "env": {"device": "NVIDIA H100 80GB HBM3"}}
    r = ranked_throughput(sim, ledger, flat(100.0))
    assert (r["step_ms"], r["exposed_comm_ms"]) == pytest.approx((30.0, 10.0)) and "priced" in r["basis"]
    assert r["tokens_per_s_per_gpu"] == pytest.approx(144 / 0.030 / 2)
    cpu = ranked_throughput(sim | {"env": {"device": "cpu (x86_64, 2 cores)"}}, ledger, flat(100.0))
    assert cpu["step_ms"] == 20.0 and "not priced" in cpu["basis"]
    real = ranked_throughput({k: v for k, v in sim.items() if k != "collectives"}, ledger, flat(100.0))
    assert (real["step_ms"], real["basis"]) == (20.0, "measured")


def test_fsdp2s_gathers_are_waited_for_where_their_unit_starts():
    """FSDP2 issues its all-gathers and reduce-scatters synchronously on side streams (the ledger: stream side,
    async false): a gather issued one unit ahead is waited for where the next gather is issued, so only what
    outlasts the unit before shows; a reduce-scatter, at the end of the backward. The same collectives on the compute
    stream (gloo on a CPU) stay blocking."""
    side = [Collective("all_gather", 4 * MB, 2, issue_ms=t, stream="side") for t in (0.0, 10.0, 20.0)]  # 2 ms each
    side += [Collective("reduce_scatter", 4 * MB, 2, issue_ms=t, stream="side") for t in (50.0, 60.0, 70.0)]
    p = predict(TL, place_fsdp(side, TL), LINK)
    assert p.exposed_ms_by_kind == {"all_gather": pytest.approx(0.0), "reduce_scatter": pytest.approx(0.0)}
    late = [Collective("all_gather", 4 * MB, 2, issue_ms=t, stream="side") for t in (0.0, 1.0)]  # waited at 1 ms
    assert predict(TL, place_fsdp(late, TL), LINK).exposed_ms_by_kind["all_gather"] == pytest.approx(1.0)
    # gathers 1 ms apart, 2 ms each: one unit ahead, two of them wait 1 ms; --fsdp-prefetch 2 (waited for at the
    # second gather on), none does
    ahead = [Collective("all_gather", 4 * MB, 2, issue_ms=t, stream="side") for t in (0.0, 1.0, 2.0)]
    assert predict(TL, place_fsdp(ahead, TL, 1), LINK).exposed_ms_by_kind["all_gather"] == pytest.approx(2.0)
    assert predict(TL, place_fsdp(ahead, TL, 2), LINK).exposed_ms_by_kind["all_gather"] == pytest.approx(0.0)
    blocking = [Collective(c.kind, c.bytes, c.group_size, c.issue_ms) for c in side]
    assert predict(TL, place_fsdp(blocking, TL), LINK).exposed_ms == pytest.approx(6 * 2.0)


def test_flux1s_fsdp_collectives_hide_under_its_compute_on_nvlink():
    """Flux.1's FSDP over 8 as measured on the H100 (2026-12-07 [P]: each run's ledger of 173 collectives a step),
    priced on NVLink4: each block's gathers hide under the block before it, the reduce-scatters under the backward
    (exposed: a few ms of a 0.5-3 s step; priced as blocking they read ~170 ms)."""
    import json
    import tarfile
    from pathlib import Path

    from flux_cp.predict.links import load as load_link

    runs = Path(__file__).parents[1] / "docs" / "archive" / "2026-12-07-h100-flux1-checkpointing" / "runs.tar.xz"
    checked = 0
    with tarfile.open(runs) as tar:
        for member in (m for m in tar.getmembers() if m.name.endswith("summary.json")):
            d = json.load(tar.extractfile(member))
            if not (d.get("comm") or {}).get("ledger"):
                continue
            step = d["metrics"]["step_ms"]["median"]
            p = predict_ledger(d["comm"]["ledger"], load_link("h200-nvlink4"), step_ms=step)
            assert p.exposed_ms < 5.0 and p.comm_ms > 100.0, (member.name, p.exposed_ms, p.comm_ms)
            checked += 1
    assert checked == 13
