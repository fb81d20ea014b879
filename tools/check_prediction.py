"""Check the prediction on real processes: a simulated rank (torch's fake process group) + a link profile
against the same configuration run as W real processes.

    python tools/measure_links.py --world 2 --out runs/links/cpu-gloo-w2.yaml       # one profile per W
    python tools/check_prediction.py --config configs/tiny.yaml --worlds 2,4 --links 'runs/links/cpu-gloo-w{W}.yaml'
    # on a multi-GPU machine: the same with an NCCL profile, --accelerator gpu: the check against NCCL

Per repeat (runs interleaved so that drift hits both sides alike), per W and setup (CP strategy: weights):
`train_bench.py --devices 1 --simulate-world W` (the prediction: its comm ledger priced with the W profile
and placed on its step by flux_cp.predict.step_model) and `train_bench.py --devices W` (the measurement), plus a W=1
`--cp none` baseline. Writes <out>/check.json and <out>/check.md (predicted vs measured, the error, the
spread across repeats and within runs) and keeps every run under <out>/runs/ for scripts/report.py.
On CPU every process runs one thread (OMP_NUM_THREADS=1) so that W processes on few cores compete alike.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from flux_cp.predict import links  # noqa: E402
from flux_cp.predict.step_model import predict_ledger  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(out: Path, args: list, common: list, timeout: int) -> dict | None:
    """One train_bench.py run (skipped if its complete summary is there already); its summary, or None."""
    path = out / "summary.json"
    if path.exists() and json.loads(path.read_text()).get("complete"):
        return json.loads(path.read_text())
    env = {**os.environ, "MASTER_PORT": str(_port()), "WANDB_SILENT": "true"}
    env.pop("LOCAL_RANK", None)
    cmd = [sys.executable, str(ROOT / "scripts" / "train_bench.py"), *map(str, args), *common, "--output", str(out)]
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    print(f"check_prediction.py: {out.name}: rc {r.returncode} in {time.time() - t:.0f} s", file=sys.stderr)
    if r.returncode != 0 or not path.exists():
        (out / "stderr.log").parent.mkdir(parents=True, exist_ok=True)
        (out / "stderr.log").write_text(r.stderr[-20000:])
        return None
    return json.loads(path.read_text())


def _spread(vals: list[float]) -> float:
    if len(vals) >= 4:
        q = statistics.quantiles(vals, n=4)
        return q[2] - q[0]
    return max(vals) - min(vals) if vals else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="check_prediction.py", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--setups", default="allgather-kv:ddp,ulysses:ddp,allgather-kv:zero,ulysses:zero",
                   help="comma list of CP strategy:weights")
    p.add_argument("--links", required=True, help="link profile per W: a path or name with {W} (e.g. cpu-gloo-w{W})")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup-steps", type=int, default=4)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--timeout-s", type=int, default=600)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")]
    setups = [tuple(s.split(":")) for s in args.setups.split(",")]
    profs = {w: links.load(args.links.replace("{W}", str(w))) for w in worlds}
    if args.accelerator == "cpu":
        os.environ["OMP_NUM_THREADS"] = "1"
    common = ["--config", args.config, "--steps", args.steps, "--warmup-steps", args.warmup_steps, "--accelerator",
              args.accelerator, "--wandb-mode", "disabled", "--group", "check-prediction"]
    common = list(map(str, common))
    runs = args.out / "runs"
    got: dict[tuple, list] = {}
    for r in range(args.repeats):
        got.setdefault(("base",), []).append(bench(runs / f"w1-none-r{r}", ["--devices", 1, "--cp", "none"], common,
                                                   args.timeout_s))
        for w in worlds:
            for cp, weights in setups:
                name = f"w{w}-{cp}-{weights}-r{r}"
                for side, extra in (("sim", ["--devices", 1, "--simulate-world", w]), ("real", ["--devices", w])):
                    got.setdefault((w, cp, weights, side), []).append(
                        bench(runs / f"{side}-{name}", [*extra, "--cp", cp, "--weights", weights], common,
                              args.timeout_s))
    base = [d["metrics"]["step_ms"]["median"] for d in got[("base",)] if d]
    rows = []
    for w in worlds:
        for cp, weights in setups:
            sims = [d for d in got[(w, cp, weights, "sim")] if d and (d.get("comm") or {}).get("ledger")]
            reals = [d for d in got[(w, cp, weights, "real")] if d]
            preds = [predict_ledger(d["comm"]["ledger"], profs[w], step_ms=d["metrics"]["step_ms"]["median"])
                     for d in sims]
            meas = [d["metrics"]["step_ms"]["median"] for d in reals]
            row = {"W": w, "cp": cp, "weights": weights, "link": profs[w].name, "n_sim": len(sims),
                   "n_real": len(reals)}
            if preds and meas:
                pm, mm = statistics.median(x.predicted_ms for x in preds), statistics.median(meas)
                row |= {"predicted_ms": pm, "compute_ms": statistics.median(x.lower_ms for x in preds),
                        "upper_ms": statistics.median(x.upper_ms for x in preds),
                        "exposed_ms": statistics.median(x.exposed_ms for x in preds),
                        "measured_ms": mm, "error_pct": 100 * (pm / mm - 1),
                        "predicted_each": [x.predicted_ms for x in preds], "measured_each": meas,
                        "measured_repeat_spread_ms": max(meas) - min(meas),
                        "measured_step_iqr_ms": statistics.median(_spread(d["per_step"]["step_ms"]) for d in reals),
                        "sim_step_iqr_ms": statistics.median(_spread(d["per_step"]["step_ms"]) for d in sims),
                        "comm_agrees": all((d.get("comm") or {}).get("per_step") == sims[0]["comm"]["per_step"]
                                           for d in reals)}
                if base:
                    row |= {"predicted_speedup": statistics.median(base) / pm, "measured_speedup":
                            statistics.median(base) / mm}
            rows.append(row)
    env = next((d["env"] for v in got.values() for d in v if d), {})
    res = {"command": " ".join(["python", "tools/check_prediction.py", *(argv or sys.argv[1:])]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": env.get("device"),
           "torch": env.get("torch"), "baseline_ms": base, "rows": rows,
           "links": {w: prof.to_dict() for w, prof in profs.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check.json").write_text(json.dumps(res, indent=1, allow_nan=False, default=str))
    (args.out / "check.md").write_text(render(res))
    print(render(res))
    return 0 if all("error_pct" in r for r in rows) else 1


def render(res: dict) -> str:
    hdr = ("W", "setup", "predicted ms", "compute only", "no overlap", "measured ms", "error", "measured across "
           "repeats (min-max)", "IQR within a run (real / sim)", "comm bytes agree", "speedup pred / meas")
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for r in res["rows"]:
        if "error_pct" not in r:
            lines.append(f"| {r['W']} | {r['cp']}:{r['weights']} | failed (sim {r['n_sim']}, real {r['n_real']}) |"
                         + " |" * (len(hdr) - 3))
            continue
        sp = (f"{r['predicted_speedup']:.2f} / {r['measured_speedup']:.2f}" if "predicted_speedup" in r else "-")
        lines.append(f"| {r['W']} | {r['cp']}:{r['weights']} | {r['predicted_ms']:.1f} | {r['compute_ms']:.1f} | "
                     f"{r['upper_ms']:.1f} | {r['measured_ms']:.1f} | {r['error_pct']:+.0f}% | "
                     f"{min(r['measured_each']):.1f}-{max(r['measured_each']):.1f} | "
                     f"{r['measured_step_iqr_ms']:.1f} / {r['sim_step_iqr_ms']:.1f} | {r['comm_agrees']} | {sp} |")
    errs = [abs(r["error_pct"]) for r in res["rows"] if "error_pct" in r]
    head = [f"Predicted (simulated rank + {', '.join(sorted({r['link'] for r in res['rows']}))}) vs measured "
            f"(real processes) step, median of {len(res['baseline_ms'])} repeats; {res['device']}, "
            f"torch {res['torch']}, "
            f"{res['date']}. Timer: perf_counter on CPU, CUDA events on GPU.",
            f"Median |error| {statistics.median(errs):.0f}%, max {max(errs):.0f}%." if errs else "No pair completed.",
            "", f"    {res['command']}", ""]
    return "\n".join(head + lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
