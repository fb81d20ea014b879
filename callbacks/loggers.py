"""A WandbLogger that cannot cost the run: wandb is an extra, summary.json is the record.

The first wandb error (no API key, no network, a dead wandb service) is reported in one line on
rank 0; from then on the logger is a no-op and the run goes on.
"""

from lightning.fabric.loggers.logger import _DummyExperiment
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_warn


class ResilientWandbLogger(WandbLogger):
    failed: str | None = None

    def _fail(self, e: Exception) -> None:
        if self.failed is None:
            self.failed = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            rank_zero_warn(f"wandb failed, continuing without it (summary.json is complete): {self.failed}")

    @property
    @rank_zero_experiment
    def experiment(self):
        if self.failed:
            return _DummyExperiment()
        try:
            return WandbLogger.experiment.fget(self)
        except Exception as e:  # wandb raises many types (UsageError, CommError, ...): all mean "no wandb"
            self._fail(e)
            return _DummyExperiment()

    def log_hyperparams(self, params) -> None:
        self._guard(super().log_hyperparams, params)

    def log_metrics(self, metrics, step=None) -> None:
        self._guard(super().log_metrics, metrics, step)

    def log_summary(self, values: dict) -> None:
        """Final figures of the run: wandb's run table and run comparison show the summary."""
        self._guard(lambda: self.experiment.summary.update(values))

    def finalize(self, status: str) -> None:
        self._guard(super().finalize, status)

    def _guard(self, fn, *args):
        if self.failed:
            return
        try:
            fn(*args)
        except Exception as e:
            self._fail(e)
