"""A WandbLogger that cannot cost the run: wandb is an extra, summary.json is the record.

wandb's start-up is bounded (`init_timeout`, env WANDB_INIT_TIMEOUT, default 20 s): online with no
network, the run goes on offline (its wandb run still saved under <output>/wandb, for `wandb sync` later). Any
other wandb error (no API key, a dead wandb service) is reported in one line on rank 0; from then on the logger
is a no-op and the run goes on.

wandb's summary of a key is its last logged value: the measured keys' summary is summary.json's (the median, min, max
and n: callbacks/timing.py wandb_summary), and the warm-up steps' keys (`warmup/...`), which summary.json does not
hold, get theirs here from the rows logged (`warmup_summary`).
"""

import shutil
import sys
from pathlib import Path

from lightning.fabric.loggers.logger import _DummyExperiment
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from flux_cp.runs.outputs import wandb_settings
from flux_cp.runs.results import flat_stats, stats


class ResilientWandbLogger(WandbLogger):
    failed: str | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, settings=wandb_settings(), **kwargs)
        if self._wandb_init.get("anonymous") is None:  # wandb warns about the setting even when unset
            self._wandb_init.pop("anonymous", None)
        self._warmup: dict[str, list[float]] = {}  # each warmup/ key's values, as logged

    def _fail(self, e: Exception) -> None:
        if self.failed is None:
            self.failed = _line(e)
            _say(f"wandb failed, continuing without it (summary.json is complete): {self.failed}")

    @property
    @rank_zero_experiment
    def experiment(self):
        if self.failed:
            return _DummyExperiment()
        try:
            return WandbLogger.experiment.fget(self)
        except Exception as e:  # wandb raises many types (UsageError, CommError, ...): all mean "no wandb"
            if self._offline:
                self._fail(e)
                return _DummyExperiment()
            _say(f"wandb online did not start ({_line(e)}); logging offline instead (`wandb sync` later)")
            self._drop_online_runs()
        self._offline = True
        self._wandb_init["mode"] = "offline"
        return self.experiment

    def _drop_online_runs(self) -> None:
        """The online attempt's run folder (wandb/run-*: no data, it never started) would sit beside the offline run
        as a second, empty run for `wandb sync`."""
        for d in Path(self.save_dir or ".", "wandb").glob("run-*"):
            shutil.rmtree(d, ignore_errors=True)

    def log_hyperparams(self, params) -> None:
        self._guard(super().log_hyperparams, params)

    def log_metrics(self, metrics, step=None) -> None:
        for k, v in metrics.items():
            if k.startswith("warmup/") and isinstance(v, (int, float)) and not isinstance(v, bool):
                self._warmup.setdefault(k, []).append(float(v))
        self._guard(super().log_metrics, metrics, step)

    def log_summary(self, values: dict) -> None:
        """Final figures of the run: wandb's run table and run comparison show the summary."""
        self._guard(lambda: self.experiment.summary.update(values | self.warmup_summary()))

    def warmup_summary(self) -> dict:
        """The warm-up steps' figures as the measured ones are summarised: each `warmup/` key's median over the
        warm-up steps under its own name (not the last step's value, wandb's default), min, max and n beside it."""
        return {k2: v for k, vals in self._warmup.items() for k2, v in flat_stats(k, stats(vals)).items()}

    def finalize(self, status: str) -> None:
        self._guard(super().finalize, status)

    def _guard(self, fn, *args):
        if self.failed:
            return
        try:
            fn(*args)
        except Exception as e:
            self._fail(e)


@rank_zero_only
def _say(msg: str) -> None:
    print(f"train_bench.py: {msg}", file=sys.stderr, flush=True)


def _line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
