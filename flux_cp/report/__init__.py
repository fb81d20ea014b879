"""The report: reconcile train runs (op times inside the step) with ops runs (isolated op times), and predict
the W-GPU step from one GPU (flux_cp.predict, link profiles in configs/links).

    report = build(Path("runs"), link=links.load("h200-nvlink4"))   # discover, group, analyse, reconcile
    paths = write(report, Path("runs/report"))                        # report.md, report.html, report.json, *.png

runs.py: discovery and grouping; analysis.py: parts, speedups, comm priced, verdicts, harness overhead (and build);
reconcile.py: "Reconciling the 1.66x"; figures.py and render.py: PNGs, markdown, HTML, JSON;
wandb_out.py: the wandb run and Report.
"""

from .analysis import Report, analyse, build, comm_prediction, harness_overhead  # noqa: F401
from .reconcile import reconcile  # noqa: F401
from .render import harness_table, render_md, strict, tables, verdict_lines, write  # noqa: F401
from .runs import COMPUTE, OPS, PART_LABEL, PARTS, ReportError, config_key, discover, group  # noqa: F401
from .wandb_out import log_wandb, wandb_report  # noqa: F401
