"""GPU checks (pytest -m gpu), run on the lent H200: torch's context_parallel dispatch path."""

import json
import os
import warnings
from collections import Counter

import pytest
import torch
import torch.distributed as dist

from flux_cp.config import DataConfig, ModelConfig
from flux_cp.data import make_batch
from flux_cp.model import FluxDiT, image_ids, text_ids
from flux_cp.parallel.cp import apply_cp
from flux_cp.parallel.registry import make_strategy

from .conftest import TINY, bench, free_port

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pg():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield
    dist.destroy_process_group()


def _fwd_bwd(model, strategy, batch, rope, run=None):  # run: the model, or the compiled model
    model.zero_grad(set_to_none=True)
    apply_cp(model, strategy)
    with strategy.step_context():
        out = (run or model)(batch["x_t"], batch["text"], batch["pooled"], batch["t"], rope)
        loss = torch.nn.functional.mse_loss(out.float(), batch["target"].float())
        loss.backward()
    return out.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "backend",
    ["auto", "flash", "efficient", pytest.param("cudnn", marks=pytest.mark.xfail(reason="torch 2.11 ring cuDNN bwd"))],
)
@pytest.mark.parametrize("rotate", ["allgather", "alltoall"])
def test_torch_cp_world1_matches_none(pg, backend, rotate):
    dev = torch.device("cuda", 0)
    mcfg = ModelConfig(num_heads=4, head_dim=128, double_blocks=1, single_blocks=1, text_dim=256, pooled_dim=64)
    dcfg = DataConfig(image_height=32, image_width=32, text_tokens=128)
    torch.manual_seed(0)
    model = FluxDiT(mcfg).to(dev, torch.bfloat16)
    batch = {k: v.to(dev, torch.bfloat16) for k, v in make_batch(dcfg, mcfg, 0).items()}
    rope = model.rope(text_ids(dcfg.text_tokens).to(dev), image_ids(32, 32).to(dev))

    ref_out, ref_grads = _fwd_bwd(model, make_strategy("none", 0, 1, dev, sdpa_backend=backend), batch, rope)
    cp = make_strategy("torch", 0, 1, dev, sdpa_backend=backend, rotate=rotate)
    out, grads = _fwd_bwd(model, cp, batch, rope)

    torch.testing.assert_close(out, ref_out, rtol=2e-2, atol=2e-2)
    for name, g in ref_grads.items():
        scale = g.abs().max().clamp_min(1e-6)
        err = (grads[name] - g).abs().max() / scale
        assert err < 5e-2, f"{name}: grad differs by {err:.3g} of its max"


@pytest.mark.parametrize("compile_", [False, True])
def test_cudnn_gradients_are_flashs_where_the_blocks_q_k_v_strides_collide(compile_):
    """q, k, v unfused (LoRA's default): the double and single blocks' q, k and v have the same strides and their dO
    not, while torch keys cuDNN's cached backward graph on q, k, v alone (tools/check_cudnn_grad_layout.py). With dO
    put in the output's strides (flux_cp.parallel.cp.sdpa), cuDNN's gradients are flash's to bf16 noise."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda", 0)
    mcfg = ModelConfig(num_heads=4, head_dim=128, double_blocks=2, single_blocks=2, text_dim=256, pooled_dim=64,
                       fuse_qkv=False)
    dcfg = DataConfig(image_height=32, image_width=32, text_tokens=128)
    torch.manual_seed(0)
    model = FluxDiT(mcfg).to(dev, torch.bfloat16)
    run = torch.compile(model) if compile_ else model
    batch = {k: v.to(dev, torch.bfloat16) for k, v in make_batch(dcfg, mcfg, 0).items()}
    rope = model.rope(text_ids(dcfg.text_tokens).to(dev), image_ids(32, 32).to(dev))
    grads = {}
    for backend in ("flash", "cudnn"):
        torch._dynamo.reset()
        _, grads[backend] = _fwd_bwd(model, make_strategy("none", 0, 1, dev, sdpa_backend=backend), batch, rope, run)
    torch.cuda.synchronize()
    for name, g in grads["flash"].items():
        err = (grads["cudnn"][name] - g).abs().max() / g.abs().max().clamp_min(1e-6)
        assert err < 5e-2, f"{name}: cuDNN's gradient differs from flash's by {err:.3g} of its max"


def test_sync_debug_names_the_call_site(tmp_path):
    """--sync-debug's callback counts a synchronizing call by its Python call site; the timer's own waits
    (sync_allowed) stay out."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from callbacks.syncs import SyncDebugCallback
    from callbacks.timing import OpTimingCallback
    from flux_cp.measure.timing import sync_allowed

    x = torch.ones(3, device="cuda")
    with warnings.catch_warnings(record=True) as seen:  # torch's own mechanism, as this torch has it
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        x.sum().item()
        torch.cuda.set_sync_debug_mode(0)
    assert any("synchronizing" in str(w.message) for w in seen), [str(w.message) for w in seen]

    timing = OpTimingCallback(tmp_path / "summary.json", {}, warmup_steps=1)
    cb = SyncDebugCallback(timing, first_step=1)
    cb.on_train_start(None, None)
    try:
        cb.on_train_batch_start(None, None, None, 0)  # warm-up: not watched
        x.sum().item()
        cb.on_train_batch_start(None, None, None, 1)
        x.sum().item()  # one blocking copy to the host
        with sync_allowed(True):
            x.sum().item()
    finally:
        cb.on_train_end(None, None)
    s = timing.summary.header["syncs"]
    assert s["steps"] == 1 and s["per_step"] == 1, s
    assert "test_sync_debug_names_the_call_site" in s["sites"][0]["stack"][-1]
    assert torch.cuda.get_sync_debug_mode() == 0


def _gpu_run(tmp_path, *args) -> dict:
    """train_bench on the tiny config on the GPU, as a user runs it: its summary.json."""
    out = tmp_path / "run"
    proc = bench("--config", TINY, "--accelerator", "gpu", "--wandb-mode", "disabled", "--output", out, *args,
                 timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_training_loop_makes_no_synchronizing_call(tmp_path):
    """A real GPU run under --sync-debug: no synchronizing call per measured step, the timing callback's
    own loss read included (only its wait on a finished step's event is exempt). A loss read by .item()
    on the device would wait for every kernel issued since, and drain the device at every step."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    syncs = _gpu_run(tmp_path, "--devices", 1, "--steps", 6, "--warmup-steps", 2, "--sync-debug", "true")["syncs"]
    assert syncs["steps"] == 6 and syncs["per_step"] == 0, syncs


@pytest.mark.parametrize("rotate", ["allgather", "alltoall"])
def test_simulated_ring_ledger_on_cuda(tmp_path, rotate):
    """torch's ring as rank 0 of a 4-rank fake-group job on CUDA: the run completes, and its ledger holds the
    ring's functional collectives (asynchronous, their consumers' waits placed on the step's CUDA events) and
    DDP's bucket all-reduces (asynchronous, consumed at the backward's end). bf16 (flash, as the ring runs on
    Flux): fp32's memory-efficient kernel pads its logsumexp to 32 rows, which 36 tokens per rank cannot merge."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    d = _gpu_run(tmp_path, "--cp", "torch", "--rotate", rotate, "--simulate-world", 4, "--steps", 3,
                 "--warmup-steps", 2, "--precision", "bf16-true")
    assert d["collectives"] == "fake" and d["simulate"] == {"world": 4, "rank": 0}
    step = d["comm"]["ledger"][0]
    ring = [e for e in step["collectives"] if e["kind"] in ("all_gather", "all_to_all") and e["group_size"] == 4]
    assert ring and all(e["async"] and e["issue_ms"] is not None for e in ring)
    assert any(e["wait_ms"] is not None and e["wait_ms"] >= e["issue_ms"] for e in ring)
    grads = [e for e in step["collectives"] if e["kind"] == "all_reduce"]
    assert grads and all(e["async"] and e["issue_ms"] <= step["phases"]["backward_end_ms"] for e in grads)


def test_compiled_ring_as_a_simulated_rank_keeps_its_ledger(tmp_path):
    """torch's ring under torch.compile as rank 0 of a 2-rank fake-group job: the ledger's kernels run from the
    compiled region's Python without being compiled themselves (the H200 run failed with "Both events must be
    recorded" when they were), and the step's ring collectives are still recorded."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    d = _gpu_run(tmp_path, "--cp", "torch", "--simulate-world", 2, "--compile", "true", "--precision", "bf16-true",
                 "--steps", 3, "--warmup-steps", 3)
    assert d["complete"] and d["compile"]["enabled"]
    kinds = {e["kind"] for e in d["comm"]["ledger"][-1]["collectives"]}
    assert "all_reduce" in kinds and kinds & {"all_gather", "all_to_all"}, kinds


@pytest.mark.parametrize("harness", ["bare", "lightning"])
def test_whole_model_cuda_graphs_as_a_simulated_ulysses_rank(tmp_path, harness):
    """Issue 26's graph recipe: Ulysses + ZeRO, the whole model under torch.compile reduce-overhead, as rank 0 of a
    2-rank fake-group job. On the H200 (flux_recipe_graphs, bare, in one process after other compiled runs) it failed
    while dynamo traced the attention processor ("AssertionError" with no message): in-process sweeps now reset
    dynamo between runs. A failure here leaves its whole traceback in error-rank0.json. The graphs' replays run
    Ulysses' all-to-alls without the dispatcher: the ledger adds what each graph captured, so a replayed step holds
    the eager step's collectives."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ("--config", TINY, "--accelerator", "gpu", "--wandb-mode", "disabled", "--harness", harness, "--cp",
            "ulysses", "--weights", "zero", "--simulate-world", 2, "--precision", "bf16-true", "--steps", 4,
            "--warmup-steps", 3)
    runs = {}
    for name, extra in (("graphs", ("--compile", "true", "--compile-mode", "reduce-overhead", "--compile-scope",
                                    "model")), ("eager", ())):
        out = tmp_path / name
        proc = bench(*args, *extra, "--output", out, timeout=600)
        errors = sorted(out.glob("error-rank*.json"))
        assert proc.returncode == 0, (errors[0].read_text() if errors else "") + proc.stderr[-3000:]
        runs[name] = json.loads((out / "summary.json").read_text())
    d = runs["graphs"]
    assert d["complete"] and d["compile"]["mode"] == "reduce-overhead"
    assert (d["metrics"]["step_ms"]["n"], d["metrics"]["step_timed_ms"]["n"]) == (3, 1)  # the ledger: step 1 of 0-3
    assert 0 < d["memory"]["allocated_gib"] <= d["memory"]["reserved_gib"]  # the rank's peak over the steps
    graphs, eager = d["comm"]["per_step"], runs["eager"]["comm"]["per_step"]
    assert {k: v["bytes"] for k, v in graphs.items()} == {k: v["bytes"] for k, v in eager.items()}
    # DDP may bucket the same gradient bytes otherwise once compiled (gradient-ready order): all-reduce counts aside
    assert all(graphs[k]["count"] == eager[k]["count"] for k in ("all_to_all", "broadcast"))
    replayed = [e for e in d["comm"]["ledger"][-1]["collectives"] if e.get("graph")]
    assert replayed and {e["kind"] for e in replayed} == {"all_to_all"} and all(e["issue_ms"] >= 0 for e in replayed)


def test_ops_only_simulated_worlds_on_cuda(tmp_path):
    """--ops-only --simulate-world on CUDA: the GEMM peak row is measured before any simulated world's strategy
    exists (it failed on the H200 with 'NoneType' has no attribute 'sdpa_backend'), then the ring per W."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    d = _gpu_run(tmp_path, "--ops-only", "--cp", "torch", "--simulate-world", "1,2", "--seq-lens", 144,
                 "--precision", "bf16-true", "--reps", 5)
    assert {(r["op"], r["world"]) for r in d["ops"]} >= {("gemm_peak", 1), ("sdpa_fwd", 1), ("sdpa_fwd", 2)}


def test_timer_reads_a_running_step_only_by_waiting():
    """StepTimer.ready() asks the step's last event without waiting; read() refuses a step the device has not
    finished unless told to wait (after the loop), and counts that wait."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from flux_cp.measure.timing import StepTimer, hold_stream

    t = StepTimer(cuda=True, enabled=False)
    t.start_step(regions=False)
    hold_stream(50.0)  # the device is busy for ~50 ms after the host has moved on
    step = t.end_step(torch.ones((), device="cuda"))
    assert not t.ready(step)
    with pytest.raises(RuntimeError, match="not all passed"):
        t.read(step)
    f = t.read(step, wait=True)
    assert t.waits == 1 and f["step_ms"] >= 40 and f["loss"] == 1.0


@pytest.mark.exclusive  # its idle probes' holds are sized from host time: 5 neighbours' runs moved it (2026-12-05)
def test_bare_and_lightning_train_alike_on_cuda(tmp_path):
    """torch's ring at world size 1 (a process group of one, DDP), fp32: the bare loop's losses are the Lightning
    run's, and the Lightning run read its steps without waiting inside the loop. Both run idle probes on one
    schedule: the device's busy time and the host's own issue time (the report's host model), out of step_ms."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ("--cp", "torch", "--precision", "32-true", "--steps", 10, "--warmup-steps", 2, "--idle-probe-every", 4)
    lit = _gpu_run(tmp_path / "lightning", *args)
    bare = _gpu_run(tmp_path / "bare", *args, "--harness", "bare")
    assert (lit["harness"], bare["harness"]) == ("lightning", "bare")
    torch.testing.assert_close(torch.tensor(bare["loss"]), torch.tensor(lit["loss"]), rtol=1e-5, atol=0)
    assert lit["reads"]["waited_in_loop"] == 0 and lit["wall_s"]["teardown"] < 5
    assert lit["sdpa_backend"] == bare["sdpa_backend"] == "efficient" == lit["sdpa_kernel"]  # the ring's fp32 kernel
    # The probes held the stream longer than the host took to issue a step (host clock, no device read): their busy
    # time is the tiny model's device work, well under its host-bound step. With reads after the loop the hold fell
    # to its 2 ms floor on the H200 (2026-12-04 call 1) and busy read as the whole step.
    for d in (lit, bare):
        holds, host, m = d["probe_hold_ms"], d["metrics"]["host_ms"]["median"], d["metrics"]
        assert len(holds) == 2 and min(holds) > host and m["device_busy_ms"]["median"] < holds[0], d["harness"]
        assert m["device_busy_ms"]["n"] == m["host_issue_ms"]["n"] == 2 and m["step_after_probe_ms"]["n"] == 2
        assert 0 < m["host_issue_ms"]["max"] < min(holds) and d["idle"]["device_idle_frac"] >= 0
        assert d["step_kinds"]["probe"] == d["step_kinds"]["settle"] == 2 and m["step_ms"]["n"] == d["step_kinds"][
            "plain"]


@pytest.mark.parametrize("harness,cp,extra", [
    ("bare", "none", ()), ("bare", "torch", ()), ("lightning", "torch", ()),
    ("bare", "torch", ("--grad-bucket-view", "true")), ("bare", "torch", ("--weights", "zero2")),
    ("bare", "torch", ("--weights", "zero2", "--zero2-gather", "forward"))],
    ids=["none", "ring", "ring-lightning", "ring-bucket-view", "ring-zero2", "ring-zero2-forward"])
def test_step_graph_trains_as_the_eager_step(tmp_path, harness, cp, extra):
    """--step-graph (issue 26): the whole step captured at the last warm-up step and replayed for 10 more trains
    as the eager step does, fp32: with no process group (cp none), and with torch's ring at world size 1 over a
    real NCCL group of one (DDP's reducer and its bucket all-reduce captured, AdamW's step count on the device),
    its gradients DDP's bucket views (--grad-bucket-view: zeroed in place, outside the graph's pool), and under
    ZeRO-2 (parallel/zero2.py: each bucket's reduce-scatter, update and gather on a side stream inside the graph;
    or the gathers under the next forward, each block waiting for its buckets' event, the last step's flushed)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ("--harness", harness, "--cp", cp, "--precision", "32-true", "--steps", 10, "--warmup-steps", 12, *extra)
    eager = _gpu_run(tmp_path / "eager", *args)
    graph = _gpu_run(tmp_path / "graph", *args, "--step-graph", "true")
    assert graph["complete"] and len(graph["loss"]) == len(eager["loss"]) == 22
    torch.testing.assert_close(torch.tensor(graph["loss"]), torch.tensor(eager["loss"]), rtol=1e-5, atol=0)


@pytest.mark.parametrize("harness,compile_,weights", [("bare", "false", "zero"), ("bare", "true", "zero"),
                                                     ("lightning", "false", "zero"), ("bare", "false", "zero2"),
                                                     ("lightning", "true", "zero2-forward"),
                                                     ("bare", "true", "zero2-overlap")])
def test_step_graph_as_a_simulated_ulysses_zero_rank(tmp_path, harness, compile_, weights):
    """--step-graph on issue 26's recipe, Ulysses + ZeRO as rank 0 of a 2-rank fake-group job (eager, and compiled
    per block inside the graph): the run completes, and its instrumented steps' ledger holds what the graph
    captured (the all-to-alls, ZeRO's broadcasts, DDP's all-reduces; ZeRO-2's reduce-scatters, issued from
    autograd's hooks, and all-gathers), the eager step's bytes."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    weights = {  # zero2-forward: the gathers under the next forward, compiled blocks' hooks eager; zero2-overlap:
        # the single blocks' all-to-alls under their MLP (inductor without its peak-memory reordering)
        "zero2-forward": ("--weights", "zero2", "--zero2-gather", "forward"),
        "zero2-overlap": ("--weights", "zero2", "--ulysses-overlap", "true")}.get(weights, ("--weights", weights))
    args = ("--harness", harness, "--cp", "ulysses", *weights, "--simulate-world", 2, "--precision",
            "bf16-true", "--steps", 4, "--warmup-steps", 12, "--compile", compile_)
    graph = _gpu_run(tmp_path / "graph", *args, "--step-graph", "true")
    eager = _gpu_run(tmp_path / "eager", *args)
    assert graph["complete"] and (graph["metrics"]["step_ms"]["n"], graph["metrics"]["step_timed_ms"]["n"]) == (3, 1)
    record = graph["comm"]["ledger"][-1]
    replayed = record["collectives"]
    assert replayed and all(e.get("graph") for e in replayed)
    g, e = graph["comm"]["per_step"], eager["comm"]["per_step"]
    assert {k: v["bytes"] for k, v in g.items()} == {k: v["bytes"] for k, v in e.items()}
    # placed inside the replay (the ledger's external events): spread over the step, ZeRO-2's asynchronous, the
    # phases in order, as the eager step's
    issued = sorted(c["issue_ms"] for c in replayed)
    step = record["step_ms"]
    assert issued[0] >= 0 and issued[-1] <= step * 1.01 and issued[-1] - issued[0] > 0.2 * step
    ph = record["phases"]
    assert 0 < ph["forward_end_ms"] < ph["backward_end_ms"] <= step * 1.01
    if "zero2" in weights:
        assert any(c["async"] for c in replayed)
    kinds = lambda cs: Counter((c["kind"], c["bytes"], c["async"]) for c in cs)  # noqa: E731
    assert kinds(replayed) == kinds(eager["comm"]["ledger"][-1]["collectives"])


@pytest.mark.parametrize(("compile_", "cp_degree"), [("false", 4), ("true", 4), ("false", 2)])
def test_step_graph_as_a_simulated_tp_rank(tmp_path, compile_, cp_degree):
    """--cp tp (parallel/tp.py: sharded weights, the sequence all-gathered and reduce-scattered around each block's
    GEMMs, DDP over the replicated weights) as rank 0 of a 4-rank fake-group job under --step-graph, eager and compiled
    per block by inductor, and as 2 TP groups of 2 (the sharded gradients' dp all-reduce, a post-accumulate hook, in
    the capture): the run completes and the graph's ledger holds the eager step's bytes."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ("--harness", "bare", "--cp", "tp", "--simulate-world", 4, "--cp-degree", cp_degree, "--data.global_batch",
            4 // cp_degree, "--precision", "bf16-true", "--steps", 4, "--warmup-steps", 12, "--compile", compile_)
    graph = _gpu_run(tmp_path / "graph", *args, "--step-graph", "true")
    eager = _gpu_run(tmp_path / "eager", *args)
    assert graph["complete"] and eager["complete"]
    g, e = graph["comm"]["per_step"], eager["comm"]["per_step"]
    assert set(e) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert {k: v["bytes"] for k, v in g.items()} == {k: v["bytes"] for k, v in e.items()}


def test_all_to_alls_awaited_apart_replay_in_a_cuda_graph(pg):
    """--ulysses-overlap's all-to-alls (parallel/ulysses_overlap.py: functional collectives issued and awaited in
    separate autograd nodes, a GEMM between) over a real NCCL group of one, forward and backward captured in one CUDA
    graph:
    the replay gives the eager loss and gradients. (Runs of W >= 2 here use the fake group: this is NCCL's path.)"""
    from flux_cp.parallel.ulysses_overlap import _Await, _Issue

    dev, name = torch.device("cuda", 0), dist.group.WORLD.group_name
    torch.manual_seed(0)
    w = torch.randn(64, 64, device=dev, requires_grad=True)
    x = torch.randn(1, 8, 64, device=dev, requires_grad=True)  # (W, ...): chunk j to rank j

    def step():
        x.grad = w.grad = None
        sent = _Issue.apply(x * 2, name, 1)
        m = x @ w  # under the all-to-all
        loss = (_Await.apply(sent, name, 1).sin() * m).sum()
        loss.backward()
        return loss.detach()

    eager = step()
    want = (x.grad.clone(), w.grad.clone())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph's docs ask
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close((x.grad, w.grad), want)


@pytest.mark.parametrize("harness,graph", [("bare", False), ("bare", True), ("lightning", False)],
                         ids=["bare", "bare-step-graph", "lightning"])
def test_contention_changes_no_loss_and_records_its_traffic(tmp_path, harness, graph):
    """--contention (parallel/contention.py) on Ulysses + ZeRO-2 as rank 0 of a 2-rank fake-group job, fp32: every
    asynchronous collective of every step (ZeRO-2's reduce-scatters and gathers) launches its traffic kernel on a side
    stream (under --step-graph captured once and replayed with the step), Ulysses' blocking all-to-alls none; the
    losses are the run's without it, and summary.json counts the kernels and bus bytes its eager ledger implies."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from flux_cp.predict.links import bus_factor

    steps, warmup = 4, 12 if graph else 2
    args = ("--harness", harness, "--cp", "ulysses", "--weights", "zero2", "--simulate-world", 2, "--precision",
            "32-true", "--steps", steps, "--warmup-steps", warmup)
    off = _gpu_run(tmp_path / "off", *args)  # eager: its ledger places every collective
    on = _gpu_run(tmp_path / "on", *args, "--contention", "true", "--step-graph", str(graph).lower())
    # over fake collectives the job's loss is null; the rank's own (rank_loss) is what the traffic must not change
    assert len(on["rank_loss"]) == steps + warmup
    torch.testing.assert_close(torch.tensor(on["rank_loss"]), torch.tensor(off["rank_loss"]), rtol=1e-5, atol=0,
                               equal_nan=True)
    c = on["contention"]
    assert "contention" not in off and c["on"] and c["ctas"] == 24 and on["config"]["run"]["contention"]
    step = [e for e in off["comm"]["ledger"][-1]["collectives"] if e["group_size"] > 1]
    traffic = [e for e in step if e["async"] and e["kind"] != "recv"]
    assert traffic and any(not e["async"] for e in step)  # both kinds in the step
    bus = sum(int(e["bytes"] * bus_factor(e["kind"], e["group_size"])) for e in traffic)
    n = steps + warmup
    assert (c["kernels"], c["bus_bytes"]) == (n * len(traffic), n * bus), (c, len(traffic), bus)
    # blocking ones are seen where Python runs the step: every eager step, the capture (replays run none)
    assert c["left_out"]["blocking"] >= (warmup if graph else n) * (len(step) - len(traffic)) > 0
    assert c["replayed"] == ((steps + 1) * len(traffic) if graph else 0)  # the capture step replays too


@pytest.mark.parametrize("extra", [("--cp", "torch"), ("--cp", "torch", "--compile", "true", "--warmup-steps", 2)],
                         ids=["ring", "ring-compiled"])
def test_checkpointing_trains_as_without_on_cuda(tmp_path, extra):
    """torch's ring at world size 1 (its dispatch under the recompute: the CP context spans the backward), fp32
    (the efficient kernel): full and selective activation checkpointing give the losses of no checkpointing, eager
    and compiled per block (dynamo traces the checkpoint and the selective policy); the recompute opens no timing
    region (the SDPA forward's figure stays that of the forward alone)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ("--precision", "32-true", "--steps", 8, "--warmup-steps", 2, "--regions-every", 1, *extra)
    runs = {m: _gpu_run(tmp_path / m, *args, "--checkpointing", m) for m in ("none", "selective", "full")}
    for m in ("selective", "full"):
        torch.testing.assert_close(torch.tensor(runs[m]["loss"]), torch.tensor(runs["none"]["loss"]), rtol=1e-4,
                                   atol=0, msg=lambda msg, m=m: f"{m}: {msg}")
        assert runs[m]["checkpointing"]["blocks"] == 4
    if "--compile" not in extra:  # the regions' figures: the recompute's SDPA calls not counted as forward
        n = {m: runs[m]["metrics"]["sdpa_fwd_ms"]["median"] for m in runs}
        assert n["full"] < 1.5 * n["none"], n
