"""A CPU run's peak memory as the planner counts it: the bytes of live tensors, not the process's resident set.

On CUDA a run's peak is the caching allocator's (torch.cuda.max_memory_allocated): the tensors' bytes. A CPU has no
such counter (its allocator reports to the profiler only while one runs), and the resident set holds the
interpreter, torch's libraries and freed pages alike. Here a dispatch mode sees every op's inputs and outputs,
counts each storage once (views and in-place results share theirs) from the first op that touches it until it is
freed (a finalizer on torch's preserved storage object), and keeps the peak of the sum. A storage made before the
window (weights, DDP's buckets) counts from its first use in it, so a run's window spans two steps: by the second,
everything the step holds has been touched; what no op touches (an earlier run's leftovers in the same process) is
not the run's and never counts.

    with LiveTensorBytes() as live:   # around the steps to measure
        ...
    live.peak_bytes
    window = LiveWindow(run)          # a run's: window.before_step(i), window.after_step(i), window.peak_bytes

Not seen: a kernel's workspace inside one op, and ops inside a compiled graph's kernels (hence eager runs only).
"""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


class LiveTensorBytes(TorchDispatchMode):
    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self._seen: dict[int, list] = {}  # storage (its C++ address) -> [a weak reference to it, its bytes counted]
        self._finalizers: list[weakref.finalize] = []
        self.now = self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_leaves((args, kwargs)):  # what the op reads: a storage made before (weights, DDP's buckets)
            if isinstance(t, torch.Tensor):
                self._add(t)
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out

    def _add(self, t: torch.Tensor) -> None:
        if is_traceable_wrapper_subclass(t):  # DTensor, float8: the bytes are their inner tensors'
            for name in t.__tensor_flatten__()[0]:
                if isinstance(inner := getattr(t, name), torch.Tensor):  # (DTensor also names its mesh)
                    self._add(inner)
            return
        if t.device.type != self.device_type:
            return
        try:
            s = t.untyped_storage()
            key, n = s._cdata, s.nbytes()  # the storage itself: its address in memory changes when it is resized
        except (NotImplementedError, RuntimeError):  # a tensor without real storage (fake, functional, sparse)
            return
        if (entry := self._seen.get(key)) is not None:  # known: resized since (FSDP2 frees and refills its
            self.now += n - entry[1]  # gathered weights with storage.resize_, which no dispatch mode sees)
            entry[1] = n
        elif n:
            self._seen[key] = [weakref.ref(s), n]
            # torch keeps one Python object per storage (its PyObject is preserved): it dies with the storage
            self._finalizers.append(weakref.finalize(s, self._free, key))
            self.now += n
        if self.now > self.peak_bytes:  # a candidate peak: counted again, storage by storage, as they are now
            self._recount()
            self.peak_bytes = max(self.peak_bytes, self.now)

    def _recount(self) -> None:
        """Every counted storage's bytes now (one freed by resizing it to 0 is still alive, and counts 0)."""
        self.now = 0
        for entry in self._seen.values():
            s = entry[0]()
            entry[1] = s.nbytes() if s is not None else 0
            self.now += entry[1]

    def _free(self, key: int) -> None:
        self.now -= self._seen.pop(key, [None, 0])[1]

    def __exit__(self, *exc):
        for f in self._finalizers:  # frees after the window are not this window's (and would keep it alive)
            f.detach()
        self._finalizers.clear()
        return super().__exit__(*exc)


MEASURED_STEPS = 2  # the first builds the optimizer's state; the second is a steady step with it


class LiveWindow:
    """A run's count: one LiveTensorBytes over its first MEASURED_STEPS warm-up steps (one window: the second step's
    peak holds every storage the first touched, weights, moments, DDP's buckets), on an eager CPU run only:
    warm-up because its per-op bookkeeping would slow a measured step, eager because the mode would be traced into a
    compiled graph. Both harnesses call it around each step; peak_bytes is 0 where nothing was counted."""

    def __init__(self, run):
        self.steps = min(MEASURED_STEPS, run.warmup_steps) if run.accelerator == "cpu" and not run.compile else 0
        self.mode: LiveTensorBytes | None = None
        self.peak_bytes = 0

    def before_step(self, i: int) -> None:
        if i == 0 and self.steps:
            self.mode = LiveTensorBytes().__enter__()

    def after_step(self, i: int) -> None:
        if i + 1 >= self.steps:
            self.close()

    def close(self) -> None:
        """Ends the count (also on an error: the mode must not outlive the run, an in-process sweep runs the next)."""
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.peak_bytes = self.mode.peak_bytes
            self.mode = None
