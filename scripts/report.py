"""Reconcile the runs under RUNS_DIR: speedups, time breakdown, comm, Amdahl prediction, verdict.

    python scripts/report.py runs/                      # -> runs/report/report.{md,html,json} + PNGs
    python scripts/report.py runs/ --link-gbps 450 --wandb-mode offline --wandb-report

Finds every summary.json under RUNS_DIR (train and ops runs, any world size and strategy).
Unreadable, schema-mismatched and incomplete runs are listed in the report, never fatal.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from flux_cp.report import ReportError, build, log_wandb, wandb_report, write  # noqa: E402


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the usage too)
        print(f"report.py: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="report.py", description=__doc__.splitlines()[0])
    p.add_argument("runs_dir", metavar="RUNS_DIR", type=Path, help="folder searched for summary.json files")
    p.add_argument("--out", type=Path, default=None, help="output folder (default RUNS_DIR/report)")
    p.add_argument("--link-gbps", type=float, default=450.0,
                   help="link rate for comm estimates, GB/s per direction (H200 NVLink: 450)")
    p.add_argument("--wandb-mode", choices=("offline", "online", "disabled"), default="offline")
    p.add_argument("--wandb-report", action="store_true", help="also build a wandb Report (online; wandb-workspaces)")
    args = p.parse_args(argv)
    try:
        report = build(args.runs_dir, link_gbps=args.link_gbps)
    except ReportError as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    out = args.out or args.runs_dir / "report"
    paths = write(report, out)
    print(f"report.py: {len(report.configs)} configuration(s), {len(report.runs)} run(s), "
          f"{len(report.skipped)} skipped/partial -> {paths['md']}, {paths['html']}", file=sys.stderr)
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
