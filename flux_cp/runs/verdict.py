"""The end of a run in one line that answers, and the command to run next.

    W=2: step 103 ms, 1.21x vs runs/train-W1-none-s144/20261203-093345 (W=1), noisy: 95-266 ms
    next: python scripts/report.py runs

The baseline is the newest complete W=1 `--cp none` training run with the same model, data, precision, compile
setting and device, found under the runs folder (scripts/report.py reconciles every W in full), timed in the same
harness (Lightning or the bare loop) when there is one, else in the other, which the line says.
"""

import json
import os
import re
from pathlib import Path

from flux_cp.config import CPU_DEFAULT, GPU_DEFAULT, RunConfig, run_setting
from flux_cp.runs.results import harness

NOISY = 0.25  # (max - min) / median of step_ms above this: the min-max range is shown
UNSTEADY = 1.4  # a baseline whose slowest step is this many times its fastest is passed over for a steadier one


def world(d: dict) -> int:
    return (d.get("simulate") or {}).get("world") or d.get("simulate_world") or d["world_size"]


# run settings that change a step's work: a baseline shares them (a LoRA run's is a LoRA run of the same adapters),
# and the closing line's next command repeats those set
WORK = ("lora_rank", "lora_alpha", "lora_targets", "checkpointing", "checkpoint_fraction", "fp8")


def _key(d: dict):
    run = d["config"]["run"]
    work = tuple(run_setting(run, k) for k in WORK)  # older summaries lack them: their defaults
    return (d["config"]["model"], d["config"]["data"], run["precision"], run["compile"], d["env"]["device"], work)


def _steady(b: dict) -> bool:
    m = b["metrics"]["step_ms"]
    return m["min"] > 0 and m["max"] / m["min"] <= UNSTEADY


def _named_for_other_w(folder: Path) -> bool:
    """The folder (or its parent) is named for a run at another W (runs/train-W2-.../<time>): a W=1 run written
    there with --output is not what its name says, so it is no one's baseline."""
    return any((m := re.match(r"(?:train|ops)-W(\d+)", part)) and int(m[1]) != 1
               for part in (folder.name, folder.parent.name))


def find_baseline(d: dict, roots: list[Path]) -> tuple[Path, dict] | None:
    """The newest baseline of d's harness, else the newest of the other (the harness's cost is in every step);
    a steady one (slowest step within UNSTEADY x the fastest) before any unsteady one, e.g. a cold machine's."""
    best: dict[str, tuple] = {}  # harness -> (steady, mtime, folder, summary)
    for root in roots:
        # runs/<name>/<time>/ and a sweep's or a parent folder's <run>/: two levels, not a walk of the whole tree
        # (an --output under /tmp or $HOME made the verdict scan it: ~280k folders, 1-10 s at each run's end)
        for p in (*Path(root).glob("*/summary.json"), *Path(root).glob("*/*/summary.json")):
            try:
                b = json.loads(p.read_text())
                ok = b.get("complete") and b.get("mode") == "train" and world(b) == 1 and b["cp"] == "none"
                ok = ok and not (b.get("simulate") or b.get("simulate_world")) and not _named_for_other_w(p.parent)
                if ok and _key(b) == _key(d) and "step_ms" in b["metrics"]:
                    rank, h = (_steady(b), p.stat().st_mtime), harness(b)
                    if h not in best or rank > best[h][:2]:
                        best[h] = (*rank, p.parent, b)
            except (OSError, ValueError, KeyError, TypeError):
                continue
    found = best.get(harness(d)) or max(best.values(), key=lambda x: x[:2], default=None)
    return found[2:] if found else None


def _ms(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def verdict(d: dict, out: Path, roots: list[Path]) -> tuple[str, str]:
    """(answer, next command) of a complete training run."""
    m = d["metrics"]["step_ms"]
    w = world(d)
    simulated = d.get("simulate") or d.get("simulate_world")
    st = d.get("steadiness")
    ci = f" (95% CI {_ms(st['ci95'][0])}-{_ms(st['ci95'][1])}, {st['n']} steps)" if st and st.get("ci95") else ""
    line = f"W={w}{' (simulated)' if simulated else ''}: step {_ms(m['median'])} ms{ci}{_work(d)}"
    ranked = d.get("ranked") or {}
    priced = bool(simulated and ranked.get("link"))  # its collectives priced on a link profile
    step = ranked["step_ms"] if priced else m["median"]
    if priced:
        line += (f"; {_ms(step)} ms with its collectives priced with {ranked['link']} "
                 f"({ranked['tokens_per_s_per_gpu']:,.0f} tokens/s a GPU"
                 + (f", MFU {ranked['mfu']:.0%})" if ranked.get("mfu") is not None else ")"))
    flags = ""
    for i, cf in enumerate([d["config"].get("config_file"), *d["config"].get("config_overlays", [])]):
        if cf and (i or Path(cf).resolve() not in (CPU_DEFAULT, GPU_DEFAULT)):  # the default model: left out
            rel = os.path.relpath(cf)
            flags += f" --config {cf if rel.startswith('..') else rel}"
    if harness(d) == "bare":  # the next runs in the same loop, to be compared with this one
        flags += " --harness bare"
    run = d["config"]["run"]
    for key in WORK:  # the baseline must share them (_key)
        if (v := run_setting(run, key)) != RunConfig.__dataclass_fields__[key].default:
            flags += f" --{key.replace('_', '-')} {v:g}" if isinstance(v, float) else f" --{key.replace('_', '-')} {v}"
    if w == 1 and d["cp"] == "none":
        line += " (the W=1 baseline)"
        nxt = f"python scripts/train_bench.py{flags} --devices 2   (or --simulate-world 2 on one device)"
    elif base := find_baseline(d, roots):
        path, b = base
        bm = b["metrics"]["step_ms"]
        # more samples a step than the baseline trains: against that many of its steps (a ratio of samples/s)
        f = _samples(d) / _samples(b)
        speedup = bm["median"] * f / step
        if speedup > w:  # CP splits the work W ways: more than W times faster is a bad baseline, not a result
            line += (f"; {speedup:.1f}x against {path} (W=1) would beat W={w} GPUs, which CP cannot: that baseline "
                     f"is suspect (its steps {_ms(bm['min'])}-{_ms(bm['max'])} ms)")
            nxt = f"python scripts/train_bench.py{flags} --devices 1 --cp none   (the baseline, again)"
        else:
            line += (f", {speedup:.2f}x vs {path} (W=1)" if f == 1 else
                     f", {speedup:.2f}x the samples/s of {path} (W=1, {_samples(b):g} sample(s) a step)")
            if harness(b) != harness(d):  # the harnesses' difference is in the ratio
                line += f", a {harness(b)} run: no {harness(d)} W=1 baseline yet"
            if simulated and not priced:  # its collectives took no time: scripts/report.py prices and places them
                line += ", compute only"
            nxt = f"python scripts/report.py {roots[0]}"
    else:
        line += ", no W=1 baseline with this config yet"
        nxt = f"python scripts/train_bench.py{flags} --devices 1 --cp none   (the baseline)"
    if st is not None:  # the tool's own test of the median (its 95% interval, drift, two modes)
        if not st["steady"]:
            line += (f", not steady ({', '.join(st['problems'])}; steps {_ms(m['min'])}-{_ms(m['max'])} ms): a smoke "
                     "figure, not a measurement (more --steps / --warmup-steps)")
    elif m["median"] > 0 and (m["max"] - m["min"]) / m["median"] > NOISY:
        line += f", noisy: {_ms(m['min'])}-{_ms(m['max'])} ms"
    return line, f"next: {nxt}"


def _samples(d: dict) -> float:
    return (d.get("throughput") or {}).get("samples_per_step") or 1


def _work(d: dict) -> str:
    """", 21.3k tokens/s a GPU, MFU 41%": work done at the median step, the unit plans compare in."""
    t = d.get("throughput") or {}
    tok = t.get("throughput/device/items_per_sec")
    if tok is None:
        return ""
    mfu = t.get("throughput/device/mfu")
    per = "a rank" if str(d.get("env", {}).get("device", "")).startswith("cpu") else "a GPU"
    return f" ({tok:,.0f} tokens/s {per}" + (f", MFU {mfu:.0%}" if mfu is not None else "") + ")"


def ops_verdict(d: dict, roots: list[Path]) -> tuple[str, str]:
    """(answer, next command) of an op-bench run: per W, each op's call against W=1's (both in this run), else its
    time per call; the corrected method, eager, at the run's first sequence length."""
    rows = [r for r in d.get("ops", []) if r["method"] == "corrected" and not r["graph"] and r["op"] != "gemm_peak"]
    if not rows:
        return "ops: nothing timed", "next: python scripts/train_bench.py --ops-only --help"
    seq = rows[0]["seq_len"]
    ms = {(r["op"], r["world"]): r["device_ms"]["median"] for r in rows if r["seq_len"] == seq}
    ops = list(dict.fromkeys(op for op, _ in ms))
    worlds = sorted({w for _, w in ms})
    parts, impossible = [], False
    for w in worlds:
        if 1 in worlds and w > 1:  # the CP split's speedup per call, where this run timed W=1 too
            ratios = {op: ms[op, 1] / ms[op, w] for op in ops if (op, 1) in ms and (op, w) in ms}
            impossible |= any(x > w for x in ratios.values())
            parts.append(f"W={w} " + ", ".join(f"{op} {x:.2f}x" for op, x in ratios.items()))
        elif w == 1 or 1 not in worlds:
            parts.append(f"W={w} " + ", ".join(f"{op} {_ms(ms[op, w])} ms" for op in ops if (op, w) in ms))
    calls = min(r["device_ms"]["n"] for r in rows)
    caveats = ([f"from {calls} timed calls per op: noisy"] if calls < 10 else []) + (
        ["a speedup above W is not CP's: a cold or noisy W=1 call"] if impossible else [])
    root = roots[0] if roots else Path("runs")
    return (f"ops per call at S={seq} (isolated: not the step; the training step is what CP speeds up): "
            + "; ".join(parts) + "".join(f" ({c})" for c in caveats), f"next: python scripts/report.py {root}")
