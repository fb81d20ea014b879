"""StepProgressBar: Lightning's rich bar in steps, not epochs ("warm-up 1/1", then "measured 3/4"), without
wandb's version tag; only on a terminal (in a log file a live bar is control codes)."""

from lightning.pytorch.callbacks import RichProgressBar


class StepProgressBar(RichProgressBar):
    def __init__(self, skip: int, steps: int):
        super().__init__()
        self.skip, self.steps = skip, steps  # warm-up (+ profiled) steps, then measured steps

    def _label(self, done: int) -> str:
        if done < self.skip:
            return f"warm-up {done}/{self.skip}"
        return f"measured {done - self.skip}/{self.steps}"

    def _get_train_description(self, current_epoch: int) -> str:
        return self._label(0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.progress is not None and self.train_progress_bar_id is not None:
            self.progress.update(self.train_progress_bar_id, description=self._label(batch_idx + 1))

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items
