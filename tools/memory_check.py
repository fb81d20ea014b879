"""The planner's memory estimate against what runs measured: for each run folder (its summary.json), the plan it ran,
the estimate scripts/plan.py prunes with (flux_cp/plan/plans.memory_gib) and the peak the run allocated.

    python tools/memory_check.py RUN_DIR... [--tar runs.tar.xz]   # folders, or every summary.json in a tarball

A row per run: model depth, tokens, samples a rank, plan, checkpointing, FP8, LoRA; measured and estimated GiB, and
the estimate's error (estimated / measured - 1). The issue's aim: within 10% for every plan run at full depth.
"""

import argparse
import json
import sys
import tarfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from flux_cp.config import config_from_summary
from flux_cp.plan.plans import run_memory_gib, weights_mode


def _summaries(paths: list[str], tar: str | None):
    for p in paths:
        f = Path(p) / "summary.json"
        if f.is_file():
            yield Path(p).name, json.loads(f.read_text())
    if tar:
        with tarfile.open(tar) as t:
            for m in sorted(t.getmembers(), key=lambda m: m.name):
                if m.name.endswith("summary.json"):
                    yield Path(m.name).parent.name, json.load(t.extractfile(m))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The planner's memory estimate against the peak each run measured.")
    ap.add_argument("runs", nargs="*", help="run folders (each with its summary.json)")
    ap.add_argument("--tar", help="a tarball of run folders (docs/results/*/runs.tar.xz)")
    args = ap.parse_args(argv)
    table = Table("run", "blocks", "tokens", "B/rank", "plan", "AC", "FP8", "LoRA", "measured GiB", "estimated GiB",
                  "error")
    errors = []
    for name, d in _summaries(args.runs, args.tar):
        peak = (d.get("memory") or {}).get("allocated_gib")
        if peak is None or not d.get("complete"):
            continue
        c = d["config"]
        est = run_memory_gib(d)
        errors.append(est / peak - 1)
        run = c["run"]
        plan = f"{weights_mode(config_from_summary(c).run)} {run['cp']}x{run['cp_degree']} " \
               f"W={d.get('simulate_world') or d['world_size']}"
        table.add_row(name, f"{c['model']['double_blocks']}+{c['model']['single_blocks']}", str(d["tokens_per_rank"]),
                      str(c["data"]["batch_size"]), plan, run.get("checkpointing", "none"), run.get("fp8", "none"),
                      str(run.get("lora_rank") or "-"), f"{peak:.1f}", f"{est:.1f}", f"{est / peak - 1:+.1%}")
    if not errors:
        print("memory_check.py: no complete run with a measured peak among those given", file=sys.stderr)
        return 2
    Console(width=200).print(table)
    print(f"{len(errors)} runs: error {min(errors):+.1%} .. {max(errors):+.1%}; within 10%: "
          f"{sum(abs(e) <= 0.10 for e in errors)} of {len(errors)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
