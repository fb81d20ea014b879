"""--step-graph: the whole training step (zero_grad, forward, loss, backward with its gradient sync, optimizer step)
captured once in one CUDA graph and replayed every step after it (torch's "whole network capture", Megatron-LM's
full-iteration CUDA graphs).

At W >= 2 the per-rank step is short and the host issues it about as fast as the device runs it (~40-70 ms of host
for 14-50 ms of kernels on an H200, docs/results/); torch.compile's reduce-overhead mode graphs the forward and the
backward but leaves the optimizer, ZeRO's broadcasts and DDP's bucket copies to the host. Replaying the whole step
costs the host a few launches (the batch copied into the graph's inputs, the replay, the loss), so the step runs at
the device's pace.

    graph = StepGraph(eager_steps=3)
    loss = graph(fn, model, opt, batch, backward)   # eager for 3 calls, then captures, then replays

A capture records kernels, not Python: the host logic of a step (DDP's reducer bookkeeping, ZeRO's shard walk,
autograd hooks) runs once, at capture, and replays are the same kernels on the same addresses. What that requires:
static shapes (every step's batch has the same), no host-device sync inside the step, an optimizer that keeps its
step count on the device (AdamW capturable=True: parallel.mesh.build_optimizer), nothing in the step reading state
that changes per step on the host (the op regions are off, the ledger learns the graph's collectives at capture and
reads where they fall after the capture step's replay).
Collectives inside the graph replay with it (NCCL supports capture; the fake group's move nothing).
"""

import torch

from flux_cp.measure.ledger import settle


class StepGraph:
    def __init__(self, eager_steps: int, set_to_none: bool = True):
        self.eager_steps = eager_steps  # eager calls first: DDP rebuilds its buckets, compile compiles, AdamW's state
        self.set_to_none = set_to_none  # False: the gradients are DDP's bucket views, static already
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: dict[str, torch.Tensor] = {}  # the graph's batch: each step's batch is copied in
        self.loss: torch.Tensor | None = None  # the graph's loss output

    def __call__(self, fn, model, opt, batch: dict, backward) -> torch.Tensor:
        """fn(model, opt, batch, backward) -> loss: one eager step (FluxStep's body)."""
        self.calls += 1
        if self.graph is None and self.calls <= self.eager_steps:
            return fn(model, opt, batch, backward)
        captured = self.graph is None
        if captured:
            self._capture(fn, model, opt, batch, backward)
        else:
            for k, t in self.inputs.items():
                t.copy_(batch[k])
        self.graph.replay()  # the capture step too: capturing runs nothing
        if captured:  # a warm-up step (checks.py): the ledger reads where its collectives fall in a replay (syncs)
            settle(self.graph)
        return self.loss.clone()  # the caller may keep it past the next replay

    def release(self) -> None:
        """Free the graph. Before the process group goes: a graph holding NCCL kernels keeps destroy_process_group
        waiting forever (pytorch#115388; seen on the H200 with DDP over a real NCCL group of one)."""
        if self.graph is not None:
            torch.cuda.synchronize()  # no replay still running
            self.graph.reset()
        self.graph, self.inputs, self.loss = None, {}, None

    def _capture(self, fn, model, opt, batch, backward) -> None:
        self.inputs = {k: v.clone() for k, v in batch.items()}
        # Grads allocated inside the capture live in the graph's pool, where replays write them (torch's recipe).
        opt.zero_grad(set_to_none=self.set_to_none)
        graph = torch.cuda.CUDAGraph()  # torch.cuda.graph synchronizes before it captures
        try:
            with torch.cuda.graph(graph):
                self.loss = fn(model, opt, self.inputs, backward)
        except RuntimeError as e:
            raise RuntimeError(f"--step-graph: the training step could not be captured in one CUDA graph ({e}); "
                               "drop --step-graph, or pick a recipe without host syncs in its step") from e
        self.graph = graph
