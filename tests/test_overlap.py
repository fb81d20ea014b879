"""--ulysses-overlap (parallel/ulysses_overlap.py): each single-stream block's all-to-alls are awaited only after MLP
work that does not read them, in the forward and in the backward the autograd engine runs. (It trains as one process:
tests/test_numerics.py; compiled blocks issue its collectives: tests/test_simulate.py.)"""

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from flux_cp.config import parse_config
from flux_cp.model import FluxDiT
from flux_cp.parallel.cp import apply_cp
from flux_cp.parallel.fake_group import init_fake_world
from flux_cp.parallel.registry import make_strategy
from flux_cp.parallel.ulysses_overlap import overlap_single_blocks

from .conftest import TINY

GEMMS = ("aten::mm", "aten::addmm", "aten::bmm")


class _Ops(TorchDispatchMode):
    """Every op in order: (name, data_ptr of what an all-to-all returns or a wait_tensor takes)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.name()
        ptr = out.data_ptr() if name.endswith("all_to_all_single") else args[0].data_ptr() if name.endswith(
            "wait_tensor") else None
        self.ops.append((name, ptr))
        return out


def _between(ops, start, key):
    """The ops after ops[start] (an all-to-all) up to its wait_tensor."""
    for j in range(start + 1, len(ops)):
        if ops[j] == ("_c10d_functional::wait_tensor", key):
            return [name for name, _ in ops[start + 1:j]]
    raise AssertionError(f"all-to-all {start} never awaited")


def overlapped_step(compile_args: dict | None = None, device="cpu") -> None:
    """Rank 0 of a simulated 2-rank job, tiny config (2 double-, 2 single-stream blocks), Ulysses with
    --ulysses-overlap: one forward and backward (its single blocks compiled with compile_args, if given)."""
    cfg = parse_config(["--config", str(TINY)])
    init_fake_world(2, 0)
    try:
        torch.manual_seed(0)
        model = FluxDiT(cfg.model).to(device)
        strategy = make_strategy("ulysses", 0, 2, torch.device(device))
        apply_cp(model, strategy)
        overlap_single_blocks(model, strategy)
        for blk in model.single_blocks if compile_args else ():
            blk.compile(**compile_args)
        si, st = 48, 24  # a rank's image and text tokens
        x, text = torch.randn(1, si, cfg.model.in_channels), torch.randn(1, st, cfg.model.text_dim)
        rope = model.rope(torch.zeros(st, 3), torch.zeros(si, 3))  # (cos, sin), each (S_l, Dh)
        batch = (x, text, torch.randn(1, cfg.model.pooled_dim), torch.rand(1))
        model(*(t.to(device) for t in batch), tuple(t.to(device) for t in rope)).square().mean().backward()
    finally:
        dist.destroy_process_group()


def test_each_all_to_all_is_awaited_after_mlp_gemms_in_forward_and_backward():
    """Eager: per single block and direction, q/k/v's all-to-all and the output's are each issued, then a GEMM of the
    MLP branch runs, then they are awaited (the autograd engine's order in the backward); 8 in all. The double-stream
    blocks' stay blocking (c10d, awaited where issued)."""
    with _Ops() as rec:
        overlapped_step()
    ops = rec.ops
    issued = [i for i, (name, _) in enumerate(ops) if name == "_c10d_functional::all_to_all_single"]
    assert len(issued) == 2 * 2 * 2  # 2 single blocks x (q/k/v, output) x (forward, backward)
    for i in issued:
        assert any(name in GEMMS for name in _between(ops, i, ops[i][1])), (i, _between(ops, i, ops[i][1]))
    assert sum(name == "c10d::alltoall_base_" for name, _ in ops) == 2 * 2 * 2  # the double blocks', blocking


def test_compiled_blocks_keep_the_mlp_gemms_between_issue_and_wait():
    """torch.compile of each single block: the forward and backward graphs AOT autograd hands a backend (inductor on
    the GPU) hold each all-to-all's wait after an MLP GEMM that follows its issue, as eager runs them."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, example_inputs):
        graphs.append([(str(n.target), n) for n in gm.graph.nodes if n.op == "call_function"])
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    overlapped_step({"backend": aot_autograd(fw_compiler=keep, bw_compiler=keep)})
    torch._dynamo.reset()
    assert len(graphs) == 2 * 2  # a forward and a backward graph per single block
    for nodes in graphs:
        issued = [i for i, (t, _) in enumerate(nodes) if t == "_c10d_functional.all_to_all_single.default"]
        assert len(issued) == 2, [t for t, _ in nodes]
        for i in issued:
            j = next(j for j, (t, n) in enumerate(nodes) if t == "_c10d_functional.wait_tensor.default"
                     and n.args[0] is nodes[i][1])
            assert any(t in ("aten.mm.default", "aten.addmm.default") for t, _ in nodes[i + 1:j]), nodes[i + 1:j]


def order_in_inductors_code(device: str) -> list[list[str]]:
    """Inductor's code for each single block (compiled with the run's torch.compile arguments, train/step.py): per
    graph, its collectives, waits and GEMMs in the order the code runs them."""
    from torch._inductor.utils import run_and_get_code

    from flux_cp.config import RunConfig
    from flux_cp.train.step import compile_options

    torch._dynamo.reset()
    run = RunConfig(cp="ulysses", ulysses_overlap=True, compile=True)
    _, codes = run_and_get_code(lambda: overlapped_step(compile_options(run, overlapped=True), device))
    torch._dynamo.reset()
    calls = ("all_to_all_single.default(", "wait_tensor.default(", "extern_kernels.mm(", "extern_kernels.addmm(")
    return [[next(c for c in calls if c in line) for line in code.splitlines() if any(c in line for c in calls)]
            for code in codes]


def assert_gemm_between_issue_and_wait(graphs: list[list[str]]) -> None:
    """Every all-to-all of every graph is followed by a GEMM before the next wait."""
    assert len(graphs) == 2 * 2 and all(g.count("all_to_all_single.default(") == 2 for g in graphs), graphs
    for g in graphs:
        for i, op in enumerate(g):
            if op == "all_to_all_single.default(":
                assert g[i + 1].startswith("extern_kernels."), g


@pytest.mark.slow  # compiles on the CPU (dynamo, inductor or aot_eager): the slow set (make test-slow, CI)
def test_inductor_keeps_the_mlp_gemms_between_issue_and_wait():
    """Inductor on CPU (its scheduler is the GPU's; tests/test_gpu.py runs it with triton): left to its peak-memory
    reordering it moved every backward wait up to its all-to-all; compile_options turns that off."""
    assert_gemm_between_issue_and_wait(order_in_inductors_code("cpu"))


@pytest.mark.gpu
def test_inductor_keeps_the_mlp_gemms_between_issue_and_wait_on_the_gpu():
    """The same with inductor's triton backend on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert_gemm_between_issue_and_wait(order_in_inductors_code("cuda"))
