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
_tf = DeviceContext.__torch_function__
calls = {"n": 0, "where": None}


def _counting_tf(self, func, types, args=(), kwargs=None):
    calls["n"] += 1
    if calls["where"] is None:  # the first torch call it intercepted, and who entered it
        calls["where"] = (f"{func}, from:\n{''.join(traceback.format_stack(limit=10)[:-1])}"
                          f"entered at:\n{entered.get(id(self), '? (not through __enter__: set_default_device?)')}")
    return _tf(self, func, types, args, kwargs)


DeviceContext.__torch_function__ = _counting_tf
_step, _seen = S.FluxStep._step, set()


def _step_reporting_modes(self, *a, **k):
    before = calls["n"]
    modes = tuple(type(m).__name__ for m in _get_current_function_mode_stack())
    out = _step(self, *a, **k)
    state = (modes, calls["n"] > before)
    if state not in _seen:  # each new state once: the modes active at the step's start, whether DeviceContext ran
        _seen.add(state)
        print(f"step {len(_seen)}: function modes {modes or 'none'}; DeviceContext calls in it "
              f"{calls['n'] - before}", file=sys.stderr)
        if calls["n"] > before and calls["where"]:
            print(f"--- DeviceContext first intercepted {calls['where']}", file=sys.stderr)
    return out


S.FluxStep._step = _step_reporting_modes
sys.argv = ["train_bench.py", *sys.argv[1:]]
runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "train_bench.py"), run_name="__main__")
