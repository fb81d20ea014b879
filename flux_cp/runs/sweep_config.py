"""A sweep's config: a YAML grid of train_bench runs, expanded and validated up front (flux_cp/runs/sweep.py runs it).

    name: cpu-small                 # sweep id: default output sweeps/<name>, wandb group
    config: configs/tiny.yaml       # train_bench's --config for every run
    timeout_s: 120                  # per-run --timeout-s (stalled step -> `timeout`), unless base/axes set it
    base: {accelerator: cpu}        # settings shared by every run
    axes:                           # cartesian product, first axis slowest
      devices: [1, 2]               # any train_bench run flag (underscored) ...
      cp: [allgather-kv, ulysses]
      data.image_height: [8, 16]    # ... or a dotted model./data. key
    exclude: [{devices: 1, cp: ulysses}]   # optional: partial points to leave out
    include:                        # optional: more points, each entry a grid of its own (below)
      - {devices: 1, cp: none}

`include:` entries are written like `axes` (a bare value is one value; a list-valued setting's one value is
[[...]], as in `axes`). Each entry is crossed with the axes it does not name, and its settings apply over `base`:
with the axes above, `{devices: 1, cp: none}` adds devices-1_cp-none_image_height-8 and -16; a key that is not an
axis (e.g. `{cp: none, sdpa_backend: [auto, flash]}`) is a setting of those points only and part of their names.
This is how one suite holds points that differ in more than their axis values, such as the W=1 baselines of a
W >= 2 grid (`axes: {simulate_world: [2, 8]}` with `base: {cp: torch}`; `include: [{simulate_world: null, cp:
none}]`). A null value, anywhere, is a setting not passed: the config's value, or train_bench's default (here: no
simulated world, one real process). Include's points run first (the baselines a grid is divided by: a call cut at
its limit still has them), then the grid's. `exclude:` applies to both: it leaves out every point whose settings
(base, then the point's) hold all of its entry's values; its keys are axes or include keys. Two points with the
same settings are an error.
"""

import dataclasses
import fnmatch
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from flux_cp.checks import resolve
from flux_cp.config import ConfigError, DataConfig, ModelConfig, RunConfig, parse_config

ROOT = Path(__file__).resolve().parents[2]
SWEEP_KEYS = ("name", "config", "output", "timeout_s", "base", "axes", "exclude", "include")
RUN_KEYS = {f.name for f in dataclasses.fields(RunConfig)}
NESTED_KEYS = {k: {f.name for f in dataclasses.fields(c)} for k, c in (("model", ModelConfig), ("data", DataConfig))}
SET_BY_SWEEP = ("output", "group")  # each run's folder and the sweep's wandb group


@dataclass
class Run:
    name: str
    point: dict  # this run's axis values
    args: list[str]  # train_bench's command line
    output: Path
    steps: int = 0  # warm-up + measured, from the resolved config (progress)
    shape: dict = field(default_factory=dict)  # seq_len, batch, world
    processes: int = 1  # the run's ranks on this machine and others (a simulated world is one)


@dataclass
class Sweep:
    name: str
    file: str
    output: Path
    runs: list[Run]
    timeout_s: float  # per run, unless base/axes set timeout_s
    only: list[str] = field(default_factory=list)  # run-name globs this invocation keeps (select()); empty: all


# ---------------------------------------------------------------- expansion and validation


def _setting_problem(key: str) -> str | None:
    """None if `key` names a train_bench setting (run flag with underscores, or model./data. key)."""
    head, _, leaf = key.partition(".")
    if leaf:
        if head in NESTED_KEYS and leaf in NESTED_KEYS[head]:
            return None
        return f"unknown setting {key!r} (model./data. keys: see configs/flux_4608.yaml)"
    if key in RUN_KEYS:
        return f"{key!r} is set by the sweep for each run" if key in SET_BY_SWEEP else None
    return f"unknown setting {key!r} (run settings: {', '.join(sorted(RUN_KEYS - set(SET_BY_SWEEP)))})"


def _flag(key: str, value) -> list[str]:
    flag = f"--{key}" if "." in key else "--" + key.replace("_", "-")
    if isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, list | dict):
        value = json.dumps(value)
    return [flag, str(value)]


def _slug(point: dict) -> str:
    parts = []
    for k, v in point.items():
        v = json.dumps(v, separators=(",", ":")) if isinstance(v, list | dict) else str(v).lower()
        parts.append(f"{k.split('.')[-1]}-{v}")
    return "_".join(parts).replace("/", "-") or "run"


def load_sweep(
    path: str | Path, output: str | None = None, timeout_s: float | None = None, *, cuda_available: bool, gpu_count: int
) -> Sweep:
    """Expand and check the whole sweep; every problem found is in one ConfigError (one per line)."""
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read sweep config ({_one_line(e)})") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a sweep config is a mapping with keys {', '.join(SWEEP_KEYS)}")
    errors = [f"unknown key {k!r} (sweep keys: {', '.join(SWEEP_KEYS)})" for k in spec if k not in SWEEP_KEYS]
    name = str(spec.get("name") or path.stem)
    base = spec.get("base") or {}
    axes = spec.get("axes")
    exclude = spec.get("exclude") or []
    include = spec.get("include") or []
    if not isinstance(base, dict):
        errors.append("base: must be a mapping of settings")
        base = {}
    if not isinstance(axes, dict) or not axes:
        errors.append("axes: needs at least one axis, e.g. `axes: {devices: [1, 2]}`")
        axes = {}
    bad = set()  # settings left out of the expansion below, so that it still finds every other problem
    for k, vals in axes.items():
        if not isinstance(vals, list) or not vals:
            errors.append(f"axes.{k}: empty axis (give a non-empty list of values)")
            bad.add(k)
    if not isinstance(exclude, list) or not all(isinstance(e, dict) for e in exclude):
        errors.append("exclude: must be a list of mappings (partial points)")
        exclude = []
    if not isinstance(include, list) or not all(isinstance(e, dict) and e for e in include):
        errors.append("include: must be a list of non-empty mappings (settings, each a value or a list of values)")
        include = []
    include = [{k: v if isinstance(v, list) else [v] for k, v in e.items()} for e in include]  # a bare value: one
    for i, e in enumerate(include):
        for k, vals in e.items():
            if not vals:
                errors.append(f"include[{i}].{k}: empty list (give a value or a non-empty list of values)")
                bad.add(k)
    varying = set(axes).union(*include)  # what exclude may name: an axis or an include key
    entries = (("base", base), ("axes", axes), *((f"include[{i}]", e) for i, e in enumerate(include)),
               *((f"exclude[{i}]", e) for i, e in enumerate(exclude)))
    for where, keys in entries:
        for k in keys:
            if problem := _setting_problem(k):
                errors.append(f"{where}.{k}: {problem}")
                bad.add(k)
            elif where.startswith("exclude") and k not in varying:
                errors.append(f"{where}.{k}: not an axis or an include key")
    config = Path(spec.get("config") or "")
    if not spec.get("config"):
        errors.append("config: missing (the train_bench config of every run, e.g. configs/tiny.yaml)")
    elif not config.is_file() and (ROOT / config).is_file():
        config = ROOT / config
    if not config.is_file() and spec.get("config"):
        errors.append(f"config: {spec['config']}: file not found")
    timeout_s = timeout_s or spec.get("timeout_s", RunConfig.timeout_s)  # the command line's, else the file's
    if not config.is_file() or not (axes := {k: v for k, v in axes.items() if k not in bad}):
        raise ConfigError("\n".join(errors))
    base = {k: v for k, v in base.items() if k not in bad}
    include = [e for e in include if not bad.intersection(e)]  # an entry with a bad setting: left out whole

    out = Path(output or spec.get("output") or Path("sweeps") / name)
    runs, point_errors, seen = [], {}, {}
    for point in _points(axes, include):
        settings = {"timeout_s": timeout_s, **base, **point}
        if any(all(k in settings and settings[k] == v for k, v in e.items()) for e in exclude):
            continue
        run_name = _slug(point)
        same = json.dumps(settings, sort_keys=True, default=str)
        if same in seen:
            errors.append(f"runs {seen[same]} and {run_name} have the same settings (an include entry repeats a "
                          "point: drop it, or exclude the point)")
            continue
        seen[same] = run_name
        args = ["--config", str(config)]
        for k, v in settings.items():
            args += [] if v is None else _flag(k, v)  # null: not passed (the config's value, or the default)
        # the sweep owns its run folders: it reruns only unfinished ones, over what they left
        args += ["--output", str(out / run_name), "--group", name, "--overwrite"]
        try:
            cfg = resolve(parse_config(args, cuda_available=cuda_available), cuda_available=cuda_available,
                          gpu_count=gpu_count)
        except ConfigError as e:
            point_errors.setdefault(str(e), []).append(run_name)
            continue
        shape = {"seq_len": cfg.data.seq_len, "batch": cfg.data.batch_size, "world": cfg.run.devices}
        runs.append(Run(run_name, point, args, out / run_name, cfg.run.warmup_steps + cfg.run.steps, shape,
                        cfg.run.devices * cfg.run.num_nodes))
    for msg, names in point_errors.items():
        errors.append(f"{_names(names)}: {msg}")
    if len({r.name for r in runs}) != len(runs):
        errors.append("two points give the same run name: make axis values distinct")
    if not runs and not errors:
        errors.append("exclude leaves no run")
    if errors:
        raise ConfigError("\n".join(errors))
    return Sweep(name, str(path), out, runs, float(timeout_s))


def _points(axes: dict, include: list[dict]):
    """Include's points (each entry crossed with the axes it does not name: axes first, in their order, then the
    entry's own keys), then the grid's."""
    for entry in include:
        grid = {k: entry.get(k, v) for k, v in axes.items()} | {k: v for k, v in entry.items() if k not in axes}
        for values in itertools.product(*grid.values()):
            yield dict(zip(grid, values))
    for values in itertools.product(*axes.values()):
        yield dict(zip(axes, values))


def _names(names: list[str]) -> str:
    return f"run {names[0]}" if len(names) == 1 else f"runs {names[0]} (+{len(names) - 1} more)"


def _one_line(e) -> str:
    return " ".join(str(e).split())


def select(sweeps: list[Sweep], only: str) -> list[Sweep]:
    """The sweeps with only the runs whose names match one of `only`'s comma-separated globs (fnmatch, e.g.
    `simulate_world-8_*`): a slice of one or more suites that fits a device call; a sweep left with no run is left
    out. A glob that matches no run of any of them is an error."""
    globs = [g.strip() for g in only.split(",") if g.strip()]
    if not globs:
        raise ConfigError(f"--only {only!r}: give run-name globs, e.g. --only 'simulate_world-8_*' (--dry-run lists "
                          "the names)")
    names = [r.name for sweep in sweeps for r in sweep.runs]
    if unmatched := [g for g in globs if not fnmatch.filter(names, g)]:
        raise ConfigError(f"--only: {', '.join(unmatched)} match(es) no run of {', '.join(s.name for s in sweeps)} "
                          "(--dry-run lists the run names)")
    out = [dataclasses.replace(sweep, runs=[r for r in sweep.runs if any(fnmatch.fnmatchcase(r.name, g)
                                                                         for g in globs)], only=globs)
           for sweep in sweeps]
    return [sweep for sweep in out if sweep.runs]
