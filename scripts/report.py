"""Reconcile the runs under RUNS_DIR: the verdict (does the 1.66x reproduce, what pays, what to run), then regimes,
speedups, time breakdown, predicted comm.

    python scripts/report.py runs/                      # -> runs/report/report.{md,html,json} + PNGs
    python scripts/report.py runs/ --link h200-nvlink4 --cpu-link configs/links/cpu-gloo.yaml --wandb-mode disabled

Finds every summary.json under RUNS_DIR (train and ops runs, any world size and strategy).
Unreadable, schema-mismatched and incomplete runs are listed in the report, never fatal.
report.md opens with the verdict, taken from the regime table, then the method, then the sections.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from flux_cp.config import ConfigError  # noqa: E402
from flux_cp.predict import links  # noqa: E402
from flux_cp.report import (  # noqa: E402
    ACROSS,
    ReportError,
    build,
    log_wandb,
    regime_lines,
    verdict_lines,
    wandb_report,
    write,
)
from flux_cp.runs.cli import (  # noqa: E402
    Parser,
    check_folder,
    first_sentences,
    items,
    load_link,
    positive,
    unwritable,
)


def parser() -> Parser:
    p = Parser(prog="report.py", description=first_sentences(__doc__))
    p.add_argument("runs_dir", metavar="RUNS_DIR", type=Path, help="folder searched for summary.json files")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: RUNS_DIR/report)")
    p.add_argument("--link", default="h200-nvlink4",
                   help="link profile for GPU runs: a configs/links name or a YAML (default: h200-nvlink4)")
    p.add_argument("--cpu-link", default=None, help="link profile for CPU runs (tools/measure_links.py writes one); "
                   "without it CPU runs' communication is not priced. With {W} in a path (--link too): one profile "
                   "per group size, the nearest measured W for the others")
    p.add_argument("--link-gbps", type=positive("GB/s"), default=None,
                   help="instead of --link: every collective at this bus bandwidth, no latency (the old estimate)")
    p.add_argument("--reconcile", default="torch(allgather)", metavar="STRATEGY",
                   help="the strategy 'Reconciling the 1.66x' decomposes (default: torch(allgather), the user's ring, "
                   "in the regime the verdict names; another: its configurations against their own W=1 step)")
    p.add_argument("--across", default=None, metavar="SETTING,...", help="compare runs that differ in these "
                   "settings as one configuration, against one W=1 baseline: lora, checkpointing, fp8 (default: "
                   "each apart, e.g. LoRA runs only with LoRA runs of the same adapters)")
    p.add_argument("--wandb-mode", choices=("offline", "online", "disabled"), default="offline",
                   help="where the report's wandb run goes (default: offline)")
    p.add_argument("--wandb-report", action="store_true", help="also build a wandb Report (online; wandb-workspaces)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = args.out or args.runs_dir / "report"
    try:  # every input checked before the runs are read and anything is written: one line, exit 2
        if not args.runs_dir.is_dir():
            raise ReportError(f"RUNS_DIR {args.runs_dir}: not a directory (give the folder holding the runs' "
                              "summary.json)")
        link = links.flat(args.link_gbps) if args.link_gbps else load_link("--link", args.link)
        cpu_link = load_link("--cpu-link", args.cpu_link) if args.cpu_link is not None else None
        if args.out is not None:
            check_folder("--out", out)
        elif why := unwritable(out):
            raise ReportError(f"RUNS_DIR {args.runs_dir}: its report folder {out}: {why} (or pick one: --out DIR)")
        across = tuple(items("--across", args.across, ACROSS)) if args.across is not None else ()
        report = build(args.runs_dir, link=link, cpu_link=cpu_link, user=args.reconcile, across=across)
    except (ReportError, ConfigError) as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    paths = write(report, out)
    print(f"report.py: {len(report.configs)} configuration(s), {len(report.runs)} run(s), "
          f"{len(report.skipped)} skipped/partial -> {paths['md']}, {paths['html']}", file=sys.stderr)
    for line in verdict_lines(report):
        print(f"report.py: {line}")
    for line in regime_lines(report):  # issue 24: which W=1 baseline and work per step give the user's 1.66x
        print(f"report.py: {line}")
    for s in report.skipped:
        print(f"report.py: {s.status}: {s.path}: {s.reason}", file=sys.stderr)
    if args.wandb_mode != "disabled":
        run_dir = None
        try:
            run_dir = log_wandb(report, paths, out, args.wandb_mode)
        except Exception as e:  # the local report is written already; wandb only mirrors it
            why = (str(e).strip().splitlines() or [""])[0]
            print(f"report.py: warning: wandb logging failed ({type(e).__name__}: {why}); local report kept",
                  file=sys.stderr)
        if args.wandb_report:
            try:
                print(f"report.py: {wandb_report(report, args.wandb_mode, run_dir)}", file=sys.stderr)
            except Exception as e:
                why = (str(e).strip().splitlines() or [""])[0]
                print(f"report.py: warning: wandb Report failed ({type(e).__name__}: {why})", file=sys.stderr)
    if not report.runs:
        print(f"report.py: error: no usable run under {args.runs_dir} (see the skipped list above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
