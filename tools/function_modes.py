"""Which torch function modes are active inside the training step, and where each was entered: every torch call in
the step goes through an active mode's __torch_function__ in Python (host time a step). py-spy found torch's
DeviceContext (a `with torch.device(...)` or torch.set_default_device) under Lightning's GPU step and not the bare
loop's (H100, W=8).

    python tools/function_modes.py --config configs/flux_4608.yaml --simulate-world 8 --cp torch --harness lightning \
        --steps 2 --warmup-steps 1 --wandb-mode disabled --output /tmp/modes      (every argument is train_bench.py's)
"""

import runpy
import sys
import traceback
from pathlib import Path

from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flux_cp.train import step as S  # noqa: E402

entered = {}  # id(mode) -> the stack that entered it
_enter = DeviceContext.__enter__


def _recording_enter(self):
    entered[id(self)] = "".join(traceback.format_stack(limit=12)[:-1])
    return _enter(self)


DeviceContext.__enter__ = _recording_enter
_step, _seen = S.FluxStep._step, []


def _step_reporting_modes(self, *a, **k):
    if not _seen:
        _seen.append(1)
        modes = _get_current_function_mode_stack()
        print(f"function modes in the step: {modes or 'none'}", file=sys.stderr)
        for m in modes:
            print(f"--- {type(m).__name__} {getattr(m, 'device', '')}, entered at:\n{entered.get(id(m), '?')}",
                  file=sys.stderr)
    return _step(self, *a, **k)


S.FluxStep._step = _step_reporting_modes
sys.argv = ["train_bench.py", *sys.argv[1:]]
runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "train_bench.py"), run_name="__main__")
