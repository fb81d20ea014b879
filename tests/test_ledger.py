"""The ledger's dispatcher kernels are registered only while a step records: collectives between recording steps
go straight to the backend (at W >= 2 the host sets the step's pace; a registered kernel costs a Python call per
collective whether it records or not: tools/ledger_cost.py)."""

import torch
import torch.distributed as dist

from flux_cp.measure.ledger import CommLedger
from flux_cp.measure.timing import StepTimer
from flux_cp.parallel.fake_group import init_fake_world


def _ours(op: str) -> bool:
    """Whether the op's BackendSelect kernel is the ledger's (registered from flux_cp/measure/ledger.py)."""
    return any("BackendSelect" in line and "flux_cp/measure/ledger.py" in line
               for line in torch._C._dispatch_dump(op).splitlines())


def test_kernels_are_registered_only_while_a_step_records():
    init_fake_world(2, 0)
    try:
        ledger = CommLedger.get()
        timer = StepTimer(cuda=False, enabled=False, ledger=ledger)
        x = torch.ones(8)
        assert not ledger.attached and not _ours("c10d::allreduce_") and not _ours("_c10d_functional::wait_tensor")
        kinds = []
        for comm in (True, False, True):  # a recording step, a plain one, a recording one
            timer.start_step(regions=False, comm=comm)
            assert ledger.attached == comm == _ours("c10d::allreduce_") == _ours("_c10d_functional::wait_tensor")
            dist.all_reduce(x)
            dist.broadcast(x, 0)
            step = timer.end_step(x.sum())
            assert not ledger.attached and not _ours("c10d::allreduce_")
            kinds.append([e["kind"] for e in step.get("comm", [])] if comm else "comm" in step)
        assert kinds == [["all_reduce", "broadcast"], False, ["all_reduce", "broadcast"]]
        dist.all_reduce(x)  # outside any step: runs, unrecorded
    finally:
        dist.destroy_process_group()


def test_a_new_world_in_the_same_process_records_its_own_group_sizes():
    """An in-process sweep makes a new fake world per run, and torch names its groups "0", "1", ... again: a
    functional collective of a W=2 run after a W=8 one records group size 2 (a cache by name gave 8 on the H200,
    2026-12-04, and priced the W=2 all-to-alls as eight ranks')."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    ledger = CommLedger.get()
    sizes = []
    for world in (8, 2):
        init_fake_world(world, 0)
        try:
            group = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))["cp"].get_group()
            timer = StepTimer(cuda=False, enabled=False, ledger=ledger)
            timer.start_step(regions=False, comm=True)
            out = funcol.all_reduce(torch.ones(world), "sum", group)
            step = timer.end_step(funcol.wait_tensor(out).sum())
            sizes.append([(e["kind"], e["group_size"]) for e in step["comm"]])
        finally:
            dist.destroy_process_group()
    assert sizes == [[("all_reduce", 8)], [("all_reduce", 2)]]


def test_compiling_while_recording_runs_no_collective_on_fake_tensors():
    """torch.compile traces with FakeTensorMode, which runs an op's Meta kernel by putting Meta in the thread's
    include set; the ledger's kernel redispatched by the tensor's own keys alone and so ran the backend's kernel on
    fake tensors: on the fake group each left work registered that no wait cleared (--ulysses-overlap, compiled:
    "unwaited collective calls" at exit), on NCCL it would launch collectives on no data. Traced here: all-to-alls
    issued and awaited apart (flux_cp/parallel/ulysses_overlap.py), forward and backward, while a step records."""
    import torch._C._distributed_c10d as c10d

    from flux_cp.parallel.ulysses_overlap import _Await, _Issue

    init_fake_world(2, 0)
    try:
        name = dist.group.WORLD.group_name
        timer = StepTimer(cuda=False, enabled=False, ledger=CommLedger.get())

        def f(x, w):
            sent = _Issue.apply(x * 2, name, 2)
            return (_Await.apply(sent, name, 2).sin() * (x @ w)).sum()

        torch._dynamo.reset()
        timer.start_step(regions=False, comm=True)
        x, w = torch.randn(2, 4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
        torch.compile(f, backend="aot_eager")(x, w).backward()
        step = timer.end_step()
        assert [e["kind"] for e in step["comm"]] == ["all_to_all"] * 2  # the step's own, forward and backward
        assert c10d._get_work_registry_size() == 0
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()


def test_a_replayed_graphs_entries_sit_at_their_offsets_once_settled():
    """resolve: a step graph's replayed collective at its replay's start plus the offset its graph's events gave
    (asynchronous as captured, its wait placed), a graph never settled at the replay's start and blocking (the upper
    bound); graph_phases: the replayed phase marks the same way. CPU stamps are seconds, offsets ms."""
    from flux_cp.measure.ledger import graph_phases, resolve

    ms = lambda a, b: (b - a) * 1e3  # noqa: E731
    settled = {"phases": [], "issue": [1.5, 30.0], "wait": [None, 42.0], "phase_ms": {"forward_end": 12.0}}
    captured = [{"kind": "reduce_scatter", "bytes": 8, "group_size": 2, "async": True, "stream": "compute",
                 "wait": None, "graph": True, "_i": i} for i in range(2)]
    t0, replay = 100.0, 100.002  # the replay starts 2 ms into the step
    placed = resolve([e | {"issue": replay, "_place": settled} for e in captured], ms, t0)
    assert [(round(r["issue_ms"], 3), r["wait_ms"] and round(r["wait_ms"], 3), r["async"], r.get("placed"))
            for r in placed] == [(3.5, None, True, True), (32.0, 44.0, True, True)]
    assert not any(k.startswith("_") for r in placed for k in r)
    unsettled = resolve([e | {"issue": replay, "_place": {"phases": []}} for e in captured], ms, t0)
    assert [(round(r["issue_ms"], 3), r["async"], r.get("placed")) for r in unsettled] == [(2.0, False, None)] * 2
    assert {k: round(v, 3) for k, v in graph_phases([("forward_end", replay, settled)], ms, t0).items()} == {
        "forward_end_ms": 14.0}
    assert graph_phases([("forward_end", replay, {"phases": []})], ms, t0) == {}
    # a later replay half as long as the settling one (its length 64 ms): the offsets are fractions of the replay
    slow = settled | {"length": 64.0}
    t1 = replay + 0.032  # this step ends 32 ms after its replay starts
    halved = resolve([e | {"issue": replay, "_place": slow} for e in captured], ms, t0, t1)
    assert [(round(r["issue_ms"], 3), r["wait_ms"] and round(r["wait_ms"], 3)) for r in halved] == [(2.75, None),
                                                                                                  (17.0, 23.0)]
    assert round(graph_phases([("forward_end", replay, slow)], ms, t0, t1)["forward_end_ms"], 3) == 8.0
    # one of several graphs in a step (reduce-overhead's forward and backward): the step outlasts it, offsets as settled
    short = settled | {"length": 10.0}
    assert [round(r["issue_ms"], 3) for r in resolve([e | {"issue": replay, "_place": short} for e in captured], ms,
                                                     t0, t1)] == [3.5, 32.0]
