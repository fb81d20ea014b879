"""--contention (flux_cp/parallel/contention.py): refused in one line where there is no device to put traffic on,
each collective sized into its traffic kernel as the link profile prices it, and the report's A/B of a simulated
rank with and without it. On the GPU: tests/test_gpu.py (the losses unchanged, the traffic in summary.json)."""

import pytest

from flux_cp.checks import resolve
from flux_cp.config import ConfigError, parse_config
from flux_cp.parallel.contention import BLOCK, WORD, plan, sized
from flux_cp.predict import links

from .conftest import TINY

LINK = links.load("h200-nvlink4")


def _resolve(*args, cuda: bool = False):
    return resolve(parse_config(["--config", str(TINY), *map(str, args)], cuda_available=cuda), cuda_available=cuda,
                   gpu_count=int(cuda))


@pytest.mark.parametrize(("args", "message"), [
    (("--simulate-world", 2, "--contention", "true"), "--contention: .* there is no GPU here .*--accelerator gpu"),
    (("--contention", "true", "--accelerator", "gpu"), "--contention: .*add --simulate-world W"),
    (("--simulate-world", 2, "--contention-ctas", 16), "--contention-ctas 16: .*add --contention true"),
    (("--ops-only", "true", "--simulate-world", 2, "--contention", "true"), "--contention: .* not the op bench"),
])
def test_contention_is_refused_where_it_has_no_simulated_rank_on_a_gpu(args, message):
    """A simulated rank's traffic needs its GPU: on a CPU, on real ranks (NCCL's kernels are the traffic), in the op
    bench, or a CTA count without --contention, one line naming the setting and the fix, before anything runs."""
    with pytest.raises(ConfigError, match=f"^{message}") as e:
        _resolve(*args, cuda="gpu" in args)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("kind", "nbytes", "n", "bus", "price_us"), [
    ("all_gather", 64 * 2**20, 4, 48 * 2**20, 12 + 48 * 2**20 / 370e3),  # output size; (n-1)/n of it on the bus
    ("all_reduce", 25 * 2**20, 2, 25 * 2**20, 15 + 25 * 2**20 / 370e3),  # 2(n-1)/n
    ("reduce_scatter", 3000, 8, 2625, 12 + 2625 / 370e3),
    ("all_to_all", 1000, 2, 500, 20 + 500 / 340e3),
    ("send", 1, 2, 1, 8 + 1 / 370e3),
])
def test_each_collective_becomes_its_bus_bytes_over_its_priced_time(kind, nbytes, n, bus, price_us):
    """A kernel of 24 CTAs moves the collective's bus bytes (nccl-tests' busbw factor), BLOCK words a CTA per
    iteration, the last iteration partly, its iterations paced so that the kernel lasts what the link prices."""
    t = plan(kind, nbytes, n, True, LINK, 24)
    assert t.bus_bytes == bus
    assert t.duration_ns == round(price_us * 1e3)
    words = -(-bus // WORD)
    assert (t.iters - 1) * 24 * BLOCK + t.last_words == words and 0 < t.last_words <= 24 * BLOCK
    assert t.pace_ns == t.duration_ns // t.iters


def test_what_runs_beside_no_compute_has_no_traffic():
    """A blocking collective (the compute waits through it), a recv (its send's kernel carries it) and a group of
    one (nothing moves) issue no kernel; more CTAs move the same bytes in fewer iterations."""
    assert plan("all_to_all", 2**20, 2, False, LINK, 24) is None
    assert plan("recv", 2**20, 2, True, LINK, 24) is None
    assert plan("all_reduce", 2**20, 1, True, LINK, 24) is None
    assert (sized(2**30, 10**6, 16).iters, sized(2**30, 10**6, 32).iters) == (4096, 2048)
    assert (sized(0, 0, 24).iters, sized(0, 0, 24).last_words, sized(0, 0, 24).pace_ns) == (1, 1, 0)  # a word, unpaced


def test_the_report_pairs_runs_with_and_without_contention(tmp_path):
    """In one call's folder, a simulated rank's run with --contention is its own configuration (not a repeat of
    the run without) and the two make a lever row: both predicted steps and the change."""
    from flux_cp.report import build

    from .test_report_regimes import SIM, predicted, put, summary

    off = put(tmp_path / "call1", "off", summary(SIM[2], "off", 40.0))
    on = summary(SIM[2], "on", 46.0)
    on["config"]["run"] |= {"contention": True, "contention_ctas": 24}
    put(tmp_path / "call1", "on", on)
    report = build(tmp_path, link=LINK)
    strategies = {c.strategy for c in report.configs}
    assert any(s.endswith(" contention bare simulated") for s in strategies), strategies
    (row,) = [r for r in report.levers["rows"] if r["lever"] == "traffic beside the compute"]
    assert (row["before"], row["after"], row["step_ms"]) == ([False, 24], [True, 24], [40.0, 46.0])
    want = [predicted(off, 2).predicted_ms, predicted(on, 2).predicted_ms]
    assert row["predicted_step_ms"] == pytest.approx(want, rel=1e-9)
    assert row["change_pct"] == pytest.approx(100 * (want[1] / want[0] - 1))
