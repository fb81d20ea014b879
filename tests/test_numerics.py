"""Real multi-process CP runs (Lightning launches gloo ranks) against the single-process model, fp64 end to end.

In fp64 (the loss and the RoPE table and rotation included) CP changes only the order of additions, so every loss
of 10 steps and every first-step gradient agree to 1e-12 relative (measured: <= 4e-16 on the losses, <= 3e-15 on the
gradients; with the loss and RoPE in fp32, as before issue 17, W=3 was off by 1.1e-7), the final parameters to 1e-10
(AdamW's lr / eps amplifies rounding: conftest.assert_exact; measured <= 5.7e-13). W=2 allgather-kv and ulysses run
in tests/test_mesh.py (every weights mode).
"""

import pytest

from .conftest import assert_exact, exact_run


@pytest.mark.parametrize(
    ("devices", "cp", "extra"),
    [
        (3, "allgather-kv", ()),
        (4, "ulysses", ()),
        # --split-conditioning: each rank computes 1/W of the AdaLN modulation features (W=2: more ranks split the
        # same way, and four processes cost CI's two cores a minute)
        (2, "allgather-kv", ("--split-conditioning", "true")),
        # --grad-bucket-view: gradients are views into DDP's buckets, zeroed in place (the views themselves:
        # tests/test_mesh.py)
        (2, "ulysses", ("--weights", "zero", "--grad-bucket-view", "true")),
        # q, k and v in an all-to-all each (the default sends them in one)
        (2, "ulysses", ("--ulysses-qkv", "separate")),
        # the single-stream blocks' all-to-alls awaited after their MLP work, proj_out split in two GEMMs
        (2, "ulysses", ("--ulysses-overlap", "true")),
    ],
)
def test_cp_matches_single_process(single_process, tmp_path, devices, cp, extra):
    got = exact_run(tmp_path, "--devices", devices, "--cp", cp, *extra)
    d = got["summary"]
    assert d["world_size"] == devices and d["cp"] == cp and d["config"]["run"]["precision"] == "64-true"
    assert d["run_name"].endswith("-splitcond-s144") == ("--split-conditioning" in extra)
    assert d["config"]["run"]["grad_bucket_view"] == ("--grad-bucket-view" in extra)
    assert_exact(got, single_process(1), rtol=1e-12)


@pytest.mark.slow  # compiles on the CPU (dynamo, inductor or aot_eager): the slow set (make test-slow, CI)
@pytest.mark.parametrize(("scope", "cp", "extra"), [("blocks", "allgather-kv", ()), ("model", "allgather-kv", ()),
                                                    ("blocks", "ulysses", ("--ulysses-overlap", "true"))])
def test_compiled_matches_eager(single_process, tmp_path, scope, cp, extra):
    """--compile (aot_eager on CPU: the graph capture and autograd; inductor is exercised on the GPU), block by
    block or the whole model in one graph, collectives inside (--ulysses-overlap: issued and awaited apart)."""
    got = exact_run(tmp_path, "--devices", 2, "--cp", cp, "--compile", "true", "--compile-backend",
                    "aot_eager", "--compile-scope", scope, "--steps", 8, "--warmup-steps", 2, *extra)
    d = got["summary"]
    assert d["compile"]["enabled"] and d["compile"]["compile_s"] > 0 and not d["op_regions"]
    assert d["compile"]["scope"] == scope and d["run_name"].endswith("-model") == (scope == "model")
    assert_exact(got, single_process(1), rtol=1e-12)
