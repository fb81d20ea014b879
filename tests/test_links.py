"""tools/measure_links.py on 2 gloo processes writes a profile that links.load reads back (a few seconds)."""

import subprocess
import sys

import yaml

from flux_cp.predict.links import load

from .conftest import ROOT


def test_measure_links_gloo_writes_a_valid_profile(tmp_path):
    out = tmp_path / "cpu-gloo.yaml"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "measure_links.py"), "--world", "2", "--backend", "gloo",
                        "--min-bytes", "1024", "--max-bytes", str(2**20), "--factor", "8", "--iters", "3",
                        "--warmup", "1", "--out", out], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    prof = load(out)
    assert prof.measured and prof.name == "cpu-gloo" and prof.extra["backend"] == "gloo" and prof.extra["world"] == 2
    assert {"all_reduce", "all_gather", "all_to_all", "send"} <= set(prof.kinds)
    for kind, k in prof.kinds.items():
        assert k.latency_us >= 0 and k.busbw_gbps > 0 and "measured" in k.source
        assert len(prof.extra["times_ms"][kind]) == len(prof.extra["sizes_bytes"]) == 4  # 1 KB, 8 KB, 64 KB, 512 KB
    assert prof.price_ms("all_reduce", 2**20, 2) > 0
    assert yaml.safe_load(out.read_text())["command"].startswith("python tools/measure_links.py")
