"""The report: reconcile train runs (op times inside the step) with ops runs (isolated op times), and predict
the W-GPU step from one GPU (flux_cp.predict.step_model, link profiles in configs/links).

    report = build(Path("runs"), link=links.load("h200-nvlink4"))   # discover, group, analyse, reconcile
    paths = write(report, Path("runs/report"))                        # report.md, report.html, report.json, *.png

runs.py: discovery and grouping; analysis.py: parts, speedups, comm priced, verdicts;
build.py: all of it from a folder; harness.py: Lightning against its bare twin;
regimes.py: the user's W >= 2 runs against each W=1 baseline and work per step, a verdict per regime, the regime the
report's verdict names; host_axis.py: each regime's speedups as a function of the host's speed (predict/host.py's
model), checked on emulated slower hosts; headline.py: that verdict (the 1.66x, what pays, what to run), report.md's
opening;
reconcile.py: "Reconciling the 1.66x" (the headline regime's figures, decomposed); levers.py: one setting's A/B;
tables.py and sections.py: report.md's tables (at most 8 columns) and sections; figures.py and render.py: PNGs,
markdown, HTML, JSON; wandb_out.py: the wandb run and Report.
"""

from .analysis import Report, analyse, comm_prediction  # noqa: F401
from .build import build  # noqa: F401
from .harness import harness_overhead  # noqa: F401
from .headline import headline  # noqa: F401
from .reconcile import reconcile  # noqa: F401
from .regimes import regimes  # noqa: F401
from .render import (  # noqa: F401
    harness_table,
    regime_lines,
    regimes_table,
    render_md,
    strict,
    tables,
    verdict_lines,
    write,
)
from .runs import ACROSS, COMPUTE, OPS, PART_LABEL, PARTS, ReportError, config_key, discover, group  # noqa: F401
from .wandb_out import log_wandb, wandb_report  # noqa: F401
