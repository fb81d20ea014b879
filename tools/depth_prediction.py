"""Flux.1's own depth from a shallow model's plans: each plan's predicted step at 19 + 38 blocks, scaled from the same
cell measured on configs/flux_4608.yaml (2 + 4 blocks), set against the plans measured whole at full depth.

    python tools/depth_prediction.py SHALLOW.plan.json FULL.plan.json [--output depth.json]

The model: a step's time (the rank's compute plus its exposed, priced collectives) splits into a part a block pays
(every block is the same GEMMs and attention a token) and a part that does not grow with depth (embedders, final
layer, loss); the latter is taken as the FLOP share outside the blocks. step(full) = step(shallow) x (fixed +
blocks x per-block) scaled by FLOPs. Where a plan ran at both depths the error is printed; that error is the
prediction's for the plans measured at the shallow depth only.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flux_cp.config import parse_config  # noqa: E402
from flux_cp.measure.flops import model_flops  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def flops(config: Path, seq_len: int) -> float:
    cfg = parse_config(["--config", str(config)], cuda_available=False)
    return model_flops(cfg.model, cfg.data, seq_len)["total"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shallow", type=Path)
    p.add_argument("full", type=Path)
    p.add_argument("--shallow-config", type=Path, default=CONFIGS / "flux_4608.yaml")
    p.add_argument("--full-config", type=Path, default=CONFIGS / "flux1.yaml")
    p.add_argument("--output", type=Path, default=None)
    a = p.parse_args(argv)
    sh, fu = (json.loads(f.read_text()) for f in (a.shallow, a.full))
    if sh["cell"] != fu["cell"]:
        print(f"depth_prediction.py: error: cells differ ({sh['cell']} vs {fu['cell']}): compare one cell",
              file=sys.stderr)
        return 2
    S = int(sh["cell"].split("-")[0][1:])
    ratio = flops(a.full_config, S) / flops(a.shallow_config, S)  # the FLOP ratio: blocks plus the fixed part
    measured = {r["plan"]: r for r in fu["plans"] if r["status"] == "ran"}
    rows = []
    for r in (r for r in sh["plans"] if r["status"] == "ran"):
        pred = r["step_ms"] * ratio
        m = measured.get(r["plan"])
        rows.append({"plan": r["plan"], "shallow_step_ms": r["step_ms"], "predicted_step_ms": pred,
                     "predicted_tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"] / ratio,
                     "mfu": r["mfu"],  # FLOPs and time scale alike: the shallow plan's MFU
                     "measured_step_ms": m and m["step_ms"], "measured_mfu": m and m["mfu"],
                     "measured_peak_gib": m and m["peak_gib"],
                     "error": m and (pred - m["step_ms"]) / m["step_ms"]})
    rows.sort(key=lambda r: r["measured_step_ms"] or r["predicted_step_ms"])
    print(f"{sh['cell']}: full depth / shallow FLOPs = {ratio:.2f}x ({sh.get('device')})")
    print(f"{'plan':32} {'shallow ms':>10} {'predicted ms':>12} {'measured ms':>11} {'error':>7} {'tok/s/GPU':>9}")
    for r in rows:
        meas = f"{r['measured_step_ms']:.1f}" if r["measured_step_ms"] else "-"
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        print(f"{r['plan']:32} {r['shallow_step_ms']:10.1f} {r['predicted_step_ms']:12.1f} {meas:>11} {err:>7} "
              f"{r['predicted_tokens_per_s_per_gpu']:9,.0f}")
    for name, m in measured.items():
        if name not in {r["plan"] for r in rows}:
            print(f"{name}: measured whole only ({m['step_ms']:.1f} ms)")
    if a.output:
        a.output.write_text(json.dumps({"cell": sh["cell"], "flop_ratio": ratio, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
