"""The communication ledger: every collective a rank issues inside a training step, with its size and place.

    ledger = CommLedger.get()            # one per process
    ledger.start(clock)                  # at the step's start (clock: the step's StepTimer clock)
    ...forward, backward, optimizer...   # every collective is recorded as it is issued
    entries = ledger.stop()              # raw entries; `resolve(entries, ms, t0)` turns stamps into ms

Where it listens: every collective of torch.distributed, whoever issues it (our strategies in Python, DDP's
C++ reducer, FSDP2, ZeroRedundancyOptimizer, torch's ring through functional collectives), reaches a
`c10d::` dispatcher op (ProcessGroup's methods call them so that collectives are traceable). A Python
kernel registered at the BackendSelect key of those ops (and of the functional ones) records the call and
redispatches below itself, to the backend's own kernel. Only collectives pay the Python call (~20-40 us each on a
2-core CPU, and as much while registered but not recording: tools/ledger_cost.py), so the kernels are registered
only while a step records (`start` .. `stop`, and a CUDA graph's capture; every step while --contention taps them:
`tap`) and removed in between: at W >= 2 the host sets the step's pace, and on an H200 a ledger in every step made
the ring's step 7-26% longer (docs/archive/2026-12-04b-h200-session.md); the harnesses record it in their
instrumented steps only. Compute ops never see it, unlike a TorchDispatchMode such as CommDebugMode, which would
add a Python call to every aten op of the step. The same kernels see a real group (gloo, NCCL) and torch's fake
one, so a simulated rank's ledger is comparable entry by entry with a real rank's.

An entry: kind, bytes (nccl-tests' "size": all_gather = output, reduce_scatter and all_to_all = input,
all_reduce and broadcast = the tensor), group_size, async (false: the issuing stream waits at once),
stream (the main compute stream or a side one, FSDP's), issue stamp and, for functional collectives, the
stamp where their consumer waits (wait_tensor; for c10d work, where its issuer says: `consumed(output)`).
flux_cp/predict/step_model.py prices them.

CUDA graphs (torch.compile's reduce-overhead mode, --step-graph): a replay runs its captured collectives without
calling the dispatcher, so the ledger keeps what each graph recorded while it was captured (whatever thread issued
on its capture stream: a whole step's backward runs on autograd's; not the step's own entries: a capture moves
nothing) and adds those entries at every replay of that graph in a step (`graph: true`). Where they fall inside the
replay: at capture the graph's first node, each collective (and its consumer's wait, and the step's phase marks)
record an external timing event (torch.cuda.Event(external=True): an event node the replay records, torch >= 2.8);
once, after a replay (StepGraph's capture step, a warm-up step that may sync), their offsets from the first node are
read (`settle`, with the replay's length from an event at its last node), and every replay's entries are placed at
its start plus those offsets as fractions of the replay (`_scale`), asynchronous ones as such.
A graph never settled keeps its entries at the replay's start, priced as exposed (`async: false`: the upper bound).
"""

import threading
import weakref

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor

# c10d op -> (kind, index of the argument whose tensors give the size)
_C10D = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce", 0),
    "broadcast_": ("broadcast", 0),
    "_allgather_base_": ("all_gather", 0),
    "allgather_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),
    "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "alltoall_base_": ("all_to_all", 1),
    "alltoall_": ("all_to_all", 1),
    "send": ("send", 0),
    "recv_": ("recv", 0),
}
# functional collectives (torch's ring, DTensor): async until wait_tensor; (kind, size scales with group?)
_FUNCOL = {
    "all_reduce": ("all_reduce", False),
    "all_gather_into_tensor": ("all_gather", True),  # size: the output, group_size x the input
    "reduce_scatter_tensor": ("reduce_scatter", False),
    "all_to_all_single": ("all_to_all", False),
    "broadcast": ("broadcast", False),
}
_AFTER = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)


def _flat(args) -> list:
    return [a for x in args for a in (x if isinstance(x, (list, tuple)) else [x])]


def _below(op, args, kwargs, t=None):
    """The op's own kernel below BackendSelect (the backend's, or Meta's while compiling), for this call only:
    the kernel's inner ops dispatch as usual. t: the call's first tensor, where the caller knows it."""
    if t is None:
        t = next((t for t in _flat(args) if isinstance(t, torch.Tensor)), None)
    keys = torch._C._dispatch_keys(t) if t is not None else torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    if torch._C._meta_in_tls_dispatch_include():
        # FakeTensorMode (compiling) runs the op with Meta in the thread's include set, which a tensor's own keys
        # lack: without it the backend's kernel ran on fake tensors, registering work that no wait ever cleared
        keys = keys.add(torch._C.DispatchKey.Meta)
    return op.redispatch(keys & _AFTER, *args, **kwargs)


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def _is_fake(args) -> bool:
    """Called while torch.compile traces (FakeTensors): not a collective of the step."""
    return any(isinstance(t, FakeTensor) for t in _flat(args))


def _named_group_size(group_name: str) -> int:
    # not cached: a process that makes a new world (in-process sweeps) names its groups "0", "1", ... again
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name).size()


def _group_size(args, group_name=None) -> int:
    if group_name is not None:
        return _named_group_size(group_name)
    from torch._C._distributed_c10d import ProcessGroup

    for a in args:
        if isinstance(a, torch.ScriptObject) and "ProcessGroup" in a._type().qualified_name():
            return ProcessGroup.unbox(a).size()  # the op's ProcessGroup argument, boxed by the dispatcher
    return 1


class CommLedger:
    _instance = None

    def __init__(self):
        self._clock = None
        self._entries: list[dict] = []
        self._by_output: dict[int, dict] = {}  # functional collectives in flight: output data_ptr -> entry
        self._local = threading.local()  # inside a collective's kernel: its inner c10d call is not counted twice
        # CUDA graphs being captured, by capture stream: a whole-step capture (--step-graph) issues the backward's
        # collectives from the autograd engine's thread, on the capture stream
        self._capturing_on: dict[int, object] = {}
        self._graphs = weakref.WeakKeyDictionary()  # CUDAGraph -> the collectives it captured
        # CUDAGraph -> {"t0": its first node's event, "phases": [(name, event)], "issue"/"wait"/"phase_ms": offsets
        # (ms from a replay's first node, per captured entry / phase) once settled}
        self._places = weakref.WeakKeyDictionary()
        self.graph_phases: list[tuple[str, object, dict]] = []  # this step's replayed phase marks (name, stamp, place)
        self._kernels = self._make_kernels()  # (namespace, op name, kernel): registered while recording
        self._libs = []  # the registrations while attached
        self._tap = None  # fn(kind, bytes, group_size, async) at every collective while set (parallel/contention.py)

    @classmethod
    def get(cls) -> "CommLedger":
        if cls._instance is None:
            cls._instance = cls()
            cls._instance._watch_graphs()
        return cls._instance

    def start(self, clock) -> None:
        self._clock, self._entries, self._by_output, self.graph_phases = clock, [], {}, []
        self._attach()

    def stop(self) -> list[dict]:
        entries, self._clock = self._entries, None
        self._by_output = {}
        if not self._capturing_on and self._tap is None:  # a capture in progress, or a tap, still listens
            self._detach()
        return entries

    def tap(self, fn) -> None:
        """Call fn(kind, nbytes, group_size, async_op) at every collective from now on, recording or not (None: no
        more): the kernels stay registered meanwhile, each collective paying their Python call in every step."""
        self._tap = fn
        if fn is not None:
            self._attach()
        elif self._clock is None and not self._capturing_on:
            self._detach()

    @property
    def attached(self) -> bool:
        """Whether its kernels are registered (every collective then pays a Python call)."""
        return bool(self._libs)

    # ------------------------------------------------------------------ recording

    def _stamp(self):
        if self._clock.cuda and torch.cuda.is_current_stream_capturing():
            return None  # inside a CUDA graph capture a timing event cannot be recorded
        return self._clock.stamp()

    def _stream(self) -> str:
        if not self._clock.cuda:
            return "compute"
        return "compute" if torch.cuda.current_stream() == torch.cuda.default_stream() else "side"

    def _capturing(self):
        """The CUDA graph the current stream is capturing (whichever thread issues on it), or None."""
        if not self._capturing_on or not torch.cuda.is_current_stream_capturing():
            return None
        graph = self._capturing_on.get(torch.cuda.current_stream().cuda_stream)
        if graph is None and len(self._capturing_on) == 1:
            # a stream joined into the one capture: DDP's reducer all-reduces on the stream DDP was built on (H200)
            graph = next(iter(self._capturing_on.values()))
        return graph

    def _listening(self) -> bool:
        return self._clock is not None or bool(self._capturing_on)

    def _record(self, kind, nbytes, group_size, async_op) -> dict:
        e = {"kind": kind, "bytes": int(nbytes), "group_size": int(group_size), "async": bool(async_op),
             "stream": "compute", "issue": None, "wait": None}
        if (graph := self._capturing()) is not None:  # kept for the graph's replays, not the step's own
            captured = self._graphs.setdefault(graph, [])
            e |= {"graph": True, "_i": len(captured), "_ev": _graph_event()}
            captured.append(e)
            return e
        if self._clock is None:  # outside a step (another stream captures meanwhile): not the step's
            return e
        e |= {"stream": self._stream(), "issue": self._stamp()}
        self._entries.append(e)
        return e

    def _replayed(self, graph) -> None:
        """A replay of `graph` is about to launch: in a recording step, the collectives it captured (and its phase
        marks), stamped at the replay's start."""
        place = self._places.get(graph)
        if place is not None:
            place["replays"] = place.get("replays", 0) + 1
        if self._clock is None:
            return
        stamp = self._stamp()
        self._entries += [{k: v for k, v in e.items() if k not in ("_ev", "_wev")} | {"issue": stamp, "_place": place}
                          for e in self._graphs.get(graph, ())]
        if place is not None:
            self.graph_phases += [(name, stamp, place) for name, _ in place["phases"]]

    def graph_mark(self, name: str) -> None:
        """A phase boundary (forward_end, backward_end) inside a capture: an event the replays record."""
        if (graph := self._capturing()) is not None and (ev := _graph_event()) is not None:
            self._place(graph)["phases"].append((name, ev))

    def _place(self, graph) -> dict:
        return self._places.setdefault(graph, {"phases": [], "t0": None})

    def settle(self, graph) -> bool:
        """The offsets (ms from the replay's first node: a first replay's upload before it does not count) of
        `graph`'s captured collectives, their waits and its phase marks, read from its last replay's events after a
        device sync. StepGraph calls it after its capture step's replay, in warm-up; a graph it does not settle
        (torch.compile's reduce-overhead) stays unplaced: no query in the timed steps. True once settled."""
        place, captured = self._places.get(graph), self._graphs.get(graph, [])
        if place is None or "issue" in place or not place.get("replays"):  # never replayed: no event recorded yet
            return place is not None and "issue" in place
        t0 = place["t0"]
        if t0 is None or place.get("t1") is None:  # torch < 2.8: no external events, none recorded
            return False
        torch.cuda.synchronize()
        off = t0.elapsed_time
        try:
            issue = [off(e["_ev"]) for e in captured]
            wait_ = [off(e["_wev"]) if e.get("_wev") is not None else None for e in captured]
            phases = {name: off(ev) for name, ev in place["phases"]}
            length = off(place["t1"])
        except RuntimeError:  # an event the replay did not record (a capture's branch): the graph stays unplaced
            return False
        place |= {"issue": issue, "wait": wait_, "phase_ms": phases, "length": length}
        return True

    def _c10d_kernel(self, op, kind, size_arg):
        names = [a.name for a in op._schema.arguments]
        i_async = names.index("async_op") if "async_op" in names else None

        local = self._local

        def kernel(*args, **kwargs):
            inside = getattr(local, "inside", False)
            a0 = args[0]  # the op's first tensor (or list of them): its output, where the dispatch keys come from
            t = a0 if isinstance(a0, torch.Tensor) else a0[0] if a0 and isinstance(a0[0], torch.Tensor) else None
            if (self._listening() or self._tap is not None) and not inside and not _is_fake(args):
                given = i_async is not None and i_async < len(args)
                async_op = args[i_async] if given else kwargs.get("async_op", True)
                nbytes, n = _nbytes(args[size_arg]), _group_size(args)
                if self._tap is not None:
                    self._tap(kind, nbytes, n, bool(async_op))
                if self._listening():
                    e = self._record(kind, nbytes, n, async_op)
                    if async_op and t is not None and _placeable(e):  # its consumer may say: consumed()
                        self._by_output[t.data_ptr()] = e
            local.inside = True  # the backend's own ops (gloo copies its result) belong to the collective
            try:
                return _below(op, args, kwargs, t)
            finally:
                local.inside = inside

        return kernel

    def consumed(self, t: torch.Tensor) -> None:
        """The compute waits here for the asynchronous collective whose output is t (its wait stamp): for c10d work
        that its issuer hands to another stream or waits on by an event (ZeRO-2's gathers under the forward), where
        no wait_tensor says so. Without it the prediction assumes the end of the phase it was issued in."""
        if (self._clock is None and not self._capturing_on) or (e := self._by_output.pop(t.data_ptr(), None)) is None:
            return
        if e.get("graph"):
            e["_wev"] = _graph_event()  # inside the capture: where the replay's compute waits
        else:
            e["wait"] = self._stamp()

    def inside(self) -> bool:
        """True while this thread is inside a collective's kernel."""
        return getattr(self._local, "inside", False)

    def _funcol_kernel(self, op, kind, gathers):
        local = self._local

        def kernel(*args, **kwargs):  # args[0]: the input tensor
            real = not isinstance(args[0], FakeTensor)
            record, tap = self._listening() and real, self._tap if real else None
            inside = getattr(local, "inside", False)
            local.inside = True
            try:
                out = _below(op, args, kwargs, args[0])
            finally:
                local.inside = inside
            if tap is not None or record:
                n = _group_size(args, args[-1])
                nbytes = _nbytes(args[0]) * (n if gathers else 1)
                if tap is not None:
                    tap(kind, nbytes, n, True)
                if record:
                    e = self._record(kind, nbytes, n, True)
                    if isinstance(out, torch.Tensor) and _placeable(e):
                        self._by_output[out.data_ptr()] = e
            return out

        return kernel

    def _wait_kernel(self, op):
        def kernel(t):
            out = _below(op, (t,), {}, t)
            if (self._clock is not None or self._capturing_on) and not isinstance(t, FakeTensor):
                e = self._by_output.pop(t.data_ptr(), None)
                if e is not None and e.get("graph"):
                    e["_wev"] = _graph_event()
                elif e is not None:
                    e["wait"] = self._stamp()
            return out

        return kernel

    def _make_kernels(self) -> list[tuple[str, str, object]]:
        # Kept out of dynamo: a kernel called from a compiled region's Python (torch's ring under --compile) was
        # itself compiled, its CUDA event stamps with it (H200: "Both events must be recorded").
        nodynamo = torch.compiler.disable
        out = []
        for name, (kind, size_arg) in _C10D.items():
            packet = getattr(torch.ops.c10d, name, None)
            if packet is not None:  # the set of c10d ops differs between torch releases
                out.append(("c10d", name, nodynamo(self._c10d_kernel(packet.default, kind, size_arg))))
        for name, (kind, gathers) in _FUNCOL.items():
            packet = getattr(torch.ops._c10d_functional, name, None)
            if packet is not None:
                out.append(("_c10d_functional", name, nodynamo(self._funcol_kernel(packet.default, kind, gathers))))
        wait = torch.ops._c10d_functional.wait_tensor.default
        return out + [("_c10d_functional", "wait_tensor", nodynamo(self._wait_kernel(wait)))]

    def _attach(self) -> None:
        """Register the kernels (~0.3 ms on a 2-core CPU), once per recording stretch."""
        if self._libs:
            return
        libs = {ns: torch.library.Library(ns, "IMPL") for ns in ("c10d", "_c10d_functional")}
        for ns, name, kernel in self._kernels:
            libs[ns].impl(name, kernel, "BackendSelect")
        self._libs = list(libs.values())  # kept alive: a Library deregisters its kernels when collected

    def _detach(self) -> None:
        """Remove the kernels: collectives go straight to the backend again (Library._destroy: torch's own way to
        drop a Library's registrations, private but the same in torch 2.11 and 2.13)."""
        for lib in self._libs:
            lib._destroy()
        self._libs = []

    def _watch_graphs(self) -> None:
        """torch.cuda.CUDAGraph's capture and replay, wrapped once per process (cudagraph trees and torch.cuda.graph
        both call them): what a graph captures is known, and when it replays."""
        graph_cls = getattr(torch.cuda, "CUDAGraph", None)
        if graph_cls is None or not torch.cuda.is_available():
            return
        begin, end, replay = graph_cls.capture_begin, graph_cls.capture_end, graph_cls.replay
        ledger, streams = self, {}  # graph -> its capture stream

        def capture_begin(graph, *args, **kwargs):
            ledger._graphs[graph] = []  # a graph captured again holds its new capture only
            ledger._places.pop(graph, None)
            # torch.cuda.graph and cudagraph trees begin a capture on the stream they capture
            streams[graph] = torch.cuda.current_stream().cuda_stream
            ledger._capturing_on[streams[graph]] = graph
            ledger._attach()  # a capture outside a recording step still learns its collectives
            out = begin(graph, *args, **kwargs)
            ledger._place(graph)["t0"] = _graph_event()  # the graph's first node: where its offsets count from
            return out

        def capture_end(graph):
            if graph in ledger._places:
                ledger._places[graph]["t1"] = _graph_event()  # its last node: a replay's length
            try:
                return end(graph)
            finally:
                if not ledger._graphs.get(graph) and not ledger._places.get(graph, {}).get("phases"):
                    ledger._places.pop(graph, None)  # nothing to place: no settling at its replays
                ledger._capturing_on.pop(streams.pop(graph, None), None)
                if ledger._clock is None and not ledger._capturing_on and ledger._tap is None:
                    ledger._detach()

        def replay_(graph):
            ledger._replayed(graph)
            return replay(graph)

        graph_cls.capture_begin, graph_cls.capture_end, graph_cls.replay = capture_begin, capture_end, replay_


def settle(graph) -> None:
    """CommLedger.settle on the process's ledger, if it has one."""
    if CommLedger._instance is not None:
        CommLedger._instance.settle(graph)


def consumed(t: torch.Tensor) -> None:
    """CommLedger.consumed on the process's ledger, if it has one."""
    if CommLedger._instance is not None:
        CommLedger._instance.consumed(t)


def ledger_for(run) -> "CommLedger | None":
    """The process's ledger, or None where the run turns it off (--ledger false) or has no process group (nothing
    to record: its steps then need no instrumented ones for it)."""
    return CommLedger.get() if run.ledger and dist.is_available() and dist.is_initialized() else None


def _placeable(e: dict) -> bool:
    """An entry whose wait can be placed: stamped in a recording step, or captured with its event in a graph."""
    return e["issue"] is not None or e.get("_ev") is not None


def _graph_event():
    """An external timing event recorded on the capturing stream, which every replay records where it reaches it
    (torch.cuda.Event(external=True), torch >= 2.8: without it an event inside a capture is a stream dependency)."""
    try:
        ev = torch.cuda.Event(enable_timing=True, external=True)
    except TypeError:  # torch < 2.8: no external events, the graph's entries stay at the replay's start
        return None
    ev.record()
    return ev


def _scale(place: dict, at: float, end: float | None) -> float:
    """Offsets of a settled graph to this replay: the settling replay (the first after capture, colder) ran longer
    than later ones (GPU tests: its last collective 5-8% past a later step's end), so offsets are its fractions of
    the replay, times this replay's length, at most its start to the step's end (a step of several graphs, as
    reduce-overhead's, holds more than the replay: then as settled; None: as settled)."""
    length = place.get("length")
    return min(1.0, (end - at) / length) if end is not None and length and end > at else 1.0


def resolve(entries: list[dict], ms, t0, t1=None) -> list[dict]:
    """Entries with their stamps as ms from the step's start (`ms(a, b)`: the clock's conversion; t1: the step's end
    stamp). A replayed graph's entry sits at its replay's start plus its place in a settled graph (_scale); else
    there, blocking (the upper bound)."""
    end = None if t1 is None else ms(t0, t1)
    out = []
    for e in entries:
        r = {k: v for k, v in e.items() if k not in ("issue", "wait", "_place", "_i", "_ev", "_wev")}
        r["issue_ms"] = None if e["issue"] is None else round(ms(t0, e["issue"]), 4)
        r["wait_ms"] = None if e["wait"] is None else round(ms(t0, e["wait"]), 4)
        if e.get("graph"):
            place = e.get("_place") or {}
            if "issue" in place and r["issue_ms"] is not None:
                at = r["issue_ms"]
                k = _scale(place, at, end)
                r["issue_ms"] = round(at + k * place["issue"][e["_i"]], 4)
                w = place["wait"][e["_i"]]
                r["wait_ms"] = None if w is None else round(at + k * w, 4)
                r["placed"] = True
            else:
                r["async"] = False
        out.append(r)
    return out


def graph_phases(phases: list, ms, t0, t1=None) -> dict:
    """A step's replayed phase marks (CommLedger.graph_phases) as `<name>_ms` from its start, where settled."""
    end = None if t1 is None else ms(t0, t1)
    out = {}
    for name, stamp, place in phases:
        if "phase_ms" in place:
            at = ms(t0, stamp)
            out[f"{name}_ms"] = round(at + _scale(place, at, end) * place["phase_ms"][name], 4)
    return out


def totals(entries: list[dict]) -> dict:
    """Count and bytes per kind: what a real rank and a simulated rank of the same run must agree on."""
    out: dict[str, dict] = {}
    for e in entries:
        t = out.setdefault(e["kind"], {"count": 0, "bytes": 0})
        t["count"] += 1
        t["bytes"] += e["bytes"]
    return out


class OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Every compute op the calling thread runs in a stretch of code (aten op, input shapes and dtypes),
    collectives aside: what a simulated rank and a real rank of the same run must both compute (--dump-ops;
    tests/test_simulate.py). On CPU that is the whole step: the backward runs in the caller's thread. Other
    threads are left out: gloo's workers run a collective's internals there, interleaved at random."""

    def __init__(self):
        super().__init__()
        self.ops: list[list] = []
        self._thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if (threading.get_ident() == self._thread and not name.startswith(("c10d::", "_c10d_functional::"))
                and not CommLedger.get().inside()):
            shapes = [[list(t.shape), str(t.dtype)[6:]] for t in torch.utils._pytree.tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor)]
            self.ops.append([name, shapes])
        return func(*args, **(kwargs or {}))
