"""Compiled kernels carried from one device call to the next: torch's portable compile cache ("Mega-Cache",
torch.compiler.save_cache_artifacts / load_cache_artifacts). A compiled Flux run compiles for 30-40 s on an H200 for
~1 s of measured steps, and each device call starts on a fresh machine; with the artifacts of the same shapes loaded,
inductor finds its graphs (and their autotuning) cached. The kernels are the same, so are the steps; a run's
compile_s is what a warm cache costs.

    FLUX_CP_COMPILE_CACHE_IN=.cache/*.bin.xz                 # loaded once, before the first run, if any exist
    FLUX_CP_COMPILE_CACHE_OUT=$OUT/compile_cache.bin.xz      # written after each run that compiled something new
    (tools/gpu_session.sh sets both; scripts/sweep.py --in-process reads them)

xz with a window wider than the artifacts: they repeat far apart (a Flux cache of 70 MB: gzip 14 MB, which with the
repository's tracked results overran what a device call carries (64 MiB); xz -1 over 128 MiB: 2.4 MB in 2.6 s).
"""

import glob
import lzma
import os
from pathlib import Path

IN, OUT = "FLUX_CP_COMPILE_CACHE_IN", "FLUX_CP_COMPILE_CACHE_OUT"


def load() -> str | None:
    """Load the artifacts FLUX_CP_COMPILE_CACHE_IN names (files or globs, separated by os.pathsep: a process saves
    only the artifacts it used, so each call's file is kept beside the earlier ones); a line saying what happened
    (None: nothing asked)."""
    spec = os.environ.get(IN)
    if not spec:
        return None
    paths = [Path(f) for entry in spec.split(os.pathsep) if entry for f in (sorted(glob.glob(entry)) or [entry])]
    found = [p for p in paths if p.is_file()]
    if not found:
        return f"compile cache: {spec} not found: compiling from scratch"
    import torch

    n, loaded, failed = 0, [], []
    for p in found:
        try:
            data = p.read_bytes()
            info = torch.compiler.load_cache_artifacts(_decompress(data))
        except Exception as e:  # noqa: BLE001  (another torch's artifacts, a truncated file: compile from scratch)
            failed.append(f"{p} not loaded ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")
            continue
        n += sum(len(v) for v in info.artifacts.values()) if info is not None else 0
        loaded.append(f"{p} ({len(data) / 1e6:.1f} MB)")
    line = f"compile cache: {n} artifacts loaded from {', '.join(loaded)}" if loaded else "compile cache:"
    return "; ".join([line, *failed]) if failed else line


def _decompress(data: bytes) -> bytes:
    return lzma.decompress(data) if data[:6] == b"\xfd7zXZ\x00" else data  # xz, as save() writes, or raw


_saved_misses = 0  # inductor's graph-cache misses at the last save: new compiles since, or not


def save() -> str | None:
    """Write the artifacts this process used (compiled, or loaded and hit: torch saves no others) to
    FLUX_CP_COMPILE_CACHE_OUT, if a compile since the last save added any; a line saying what was written (None:
    nothing to do)."""
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
    data = lzma.compress(got[0], format=lzma.FORMAT_XZ, filters=[{"id": lzma.FILTER_LZMA2, "preset": 1,
                                                                  "dict_size": 128 << 20}])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)  # whole or not at all: a call cut at its limit returns the last complete one
    _saved_misses = misses
    return f"compile cache: {len(data) / 1e6:.1f} MB written to {path}"
