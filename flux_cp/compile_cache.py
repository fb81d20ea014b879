"""Compiled kernels carried from one device call to the next: torch's portable compile cache ("Mega-Cache",
torch.compiler.save_cache_artifacts / load_cache_artifacts). A compiled Flux run compiles for 30-40 s on an H200 for
~1 s of measured steps, and each device call starts on a fresh machine; with the artifacts of the same shapes loaded,
inductor finds its graphs (and their autotuning) cached. The kernels are the same, so are the steps; a run's
compile_s is what a warm cache costs.

    FLUX_CP_COMPILE_CACHE_IN=.cache/compile_cache.bin.gz     # loaded once, before the first run, if it exists
    FLUX_CP_COMPILE_CACHE_OUT=$OUT/compile_cache.bin.gz      # written after each run that compiled something new
    (scripts/gpu_session.sh sets both; scripts/sweep.py --in-process reads them)
"""

import gzip
import os
from pathlib import Path

IN, OUT = "FLUX_CP_COMPILE_CACHE_IN", "FLUX_CP_COMPILE_CACHE_OUT"


def load() -> str | None:
    """Load the artifacts FLUX_CP_COMPILE_CACHE_IN names; a line saying what happened (None: nothing asked)."""
    path = os.environ.get(IN)
    if not path:
        return None
    p = Path(path)
    if not p.is_file():
        return f"compile cache: {p} not found: compiling from scratch"
    import torch

    try:
        data = p.read_bytes()
        info = torch.compiler.load_cache_artifacts(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    except Exception as e:  # noqa: BLE001  (another torch's artifacts, a truncated file: compile from scratch)
        return f"compile cache: {p} not loaded ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    n = sum(len(v) for v in info.artifacts.values()) if info is not None else 0
    return f"compile cache: {n} artifacts loaded from {p} ({len(data) / 1e6:.1f} MB)"


_saved_misses = 0  # inductor's graph-cache misses at the last save: new compiles since, or not


def save() -> str | None:
    """Write every artifact this process compiled or loaded to FLUX_CP_COMPILE_CACHE_OUT, if a compile since the last
    save added any; a line saying what was written (None: nothing to do)."""
    global _saved_misses
    path = os.environ.get(OUT)
    if not path:
        return None
    from torch._dynamo.utils import counters

    misses = counters["inductor"]["fxgraph_cache_miss"]
    if misses == _saved_misses:
        return None
    import torch

    got = torch.compiler.save_cache_artifacts()
    if got is None:
        return None
    data = gzip.compress(got[0], compresslevel=1)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)  # whole or not at all: a call cut at its limit returns the last complete one
    _saved_misses = misses
    return f"compile cache: {len(data) / 1e6:.1f} MB written to {path}"
