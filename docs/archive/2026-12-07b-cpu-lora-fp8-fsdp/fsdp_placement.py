# Flux.1's FSDP collectives (the H100 runs of 2026-12-07 [P], each summary's ledger) priced on NVLink4 as FSDP2 runs
# them (predict.step_model.place_fsdp: a unit's all-gather waited for where the unit starts, reduce-scatters at the
# end of the backward) against the earlier pricing, which took them as blocking (every byte exposed).
# Run: python docs/archive/2026-12-07b-cpu-lora-fp8-fsdp/fsdp_placement.py
import json
import tarfile
from pathlib import Path

from flux_cp.predict.links import load
from flux_cp.predict.step_model import predict, timeline_from_record
from flux_cp.runs.throughput import ranked_throughput, throughput_of

runs = Path("docs/archive/2026-12-07-h100-flux1-checkpointing/runs.tar.xz")
link = load("h200-nvlink4")
with tarfile.open(runs) as tar:
    for member in sorted((m for m in tar.getmembers() if m.name.endswith("summary.json")), key=lambda m: m.name):
        d = json.load(tar.extractfile(member))
        if not (d.get("comm") or {}).get("ledger"):
            continue
        step = d["metrics"]["step_ms"]["median"]
        new = ranked_throughput(d, d["comm"]["ledger"])
        tl, colls = timeline_from_record(d["comm"]["ledger"][-1])
        blocking = predict(tl, [type(c)(c.kind, c.bytes, c.group_size, c.issue_ms) for c in colls], link)
        old_ms = step + blocking.exposed_ms * step / tl.step_ms
        old = throughput_of(d, old_ms)
        print(f"{member.name.split('/')[-2]:55} compute {step:7.1f} ms | blocking {old_ms:7.1f} ms "
              f"{old['throughput/device/items_per_sec']:,.0f} tok/s/GPU MFU {old['throughput/device/mfu']:.1%} | "
              f"placed {new['step_ms']:7.1f} ms (exposed {new['exposed_comm_ms']:.1f}) "
              f"{new['tokens_per_s_per_gpu']:,.0f} tok/s/GPU MFU {new['mfu']:.1%} | priced {blocking.comm_ms:.0f} ms")
