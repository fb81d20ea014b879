"""Run a sweep of train_bench runs from a YAML grid (flux_cp/runs/sweep_config.py has the format).

    python scripts/sweep.py configs/sweep_cpu.yaml                 # -> sweeps/cpu-small/{sweep.json,<run>/...}
    python scripts/sweep.py configs/sweep_flux.yaml --dry-run --gpus 8   # check and list, run nothing
    python scripts/sweep.py configs/suites/flux_recipe_best.yaml --only 'simulate_world-8_*' --in-process  # a slice
    python scripts/sweep.py configs/suites/a.yaml configs/suites/b.yaml --output-root out --in-process  # out/a, out/b
    python scripts/report.py sweeps/cpu-small                      # the sweep's report

Every problem in the sweep config is reported at once, before anything runs (exit 2). Runs go one
by one, each in its own processes; a failed, out-of-memory or hung run is recorded in sweep.json
and the sweep goes on. Running the same command again does not rerun the runs already complete (resume).
Ctrl-C (or SIGTERM) stops the running run, records it and ends with the command that resumes.
Exit code: 0 all runs ok, 1 some not, 2 bad sweep config, 130 interrupted.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from flux_cp.config import ConfigError  # noqa: E402
from flux_cp.runs.cli import Parser, at_least, check_folder, first_sentences, positive  # noqa: E402
from flux_cp.runs.failures import EXIT_CONFIG, EXIT_INTERRUPTED  # noqa: E402
from flux_cp.train import compile_cache  # noqa: E402


def parser() -> Parser:
    p = Parser(prog="sweep.py", description=first_sentences(__doc__))
    p.add_argument("sweep", nargs="+", help="sweep YAML (configs/sweep_*.yaml, configs/suites/*.yaml); several run "
                   "one after another")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--output", help="sweep folder (one sweep; default: the file's `output`, else sweeps/<name>)")
    out.add_argument("--output-root", help="each sweep into <output-root>/<its file's name without .yaml>")
    p.add_argument("--timeout-s", type=positive("seconds"), help="per-run --timeout-s (default: the file's "
                   "`timeout_s`)")
    p.add_argument("--gpus", type=at_least(0), help="validate as if this many GPUs were visible (with --dry-run)")
    p.add_argument("--dry-run", action="store_true", help="check the sweep and list its runs; run nothing")
    p.add_argument("--only", help="run only the runs whose names match these comma-separated globs, e.g. "
                   "'simulate_world-8_*,simulate_world-none_*' (a slice that fits a device call; --dry-run: names)")
    p.add_argument("--in-process", action="store_true",
                   help="run every run in this process (one-process runs only): imports once, not once per run")
    return p


def _refuse(message: str) -> int:
    print(f"sweep.py: error: {message}", file=sys.stderr)
    return EXIT_CONFIG


def main(argv: list[str] | None = None) -> int:
    from flux_cp.measure.timing import deepen_launch_queue

    deepen_launch_queue()  # before CUDA starts (in-process runs share its context): the idle probe must not stall
    p = parser()
    a = p.parse_args(argv)
    if a.output is not None and len(a.sweep) > 1:
        p.error("--output takes one sweep: use --output-root for several")
    for file in a.sweep:  # before torch's import: a mistyped name is told at once
        f = Path(file)
        if not f.is_file():
            why = "a folder" if f.is_dir() else "no such file"
            return _refuse(f"sweep {file}: {why} (give a sweep YAML, e.g. configs/sweep_cpu.yaml or "
                           "configs/suites/<suite>.yaml)")
    for flag, value in (("--output", a.output), ("--output-root", a.output_root)):
        if value is not None and not value.strip():
            return _refuse(f"{flag} '': give a folder")

    import torch
    from rich.console import Console

    from flux_cp.runs.sweep import Runner, signal_name
    from flux_cp.runs.sweep_config import load_sweep, select

    console = Console(stderr=True)
    cuda = torch.cuda.is_available() if a.gpus is None else a.gpus > 0
    gpus = torch.cuda.device_count() if a.gpus is None else a.gpus
    sweeps = []
    for file in a.sweep:  # every file checked before anything runs
        output = str(Path(a.output_root) / Path(file).stem) if a.output_root else a.output
        try:
            sweeps.append(load_sweep(file, output, a.timeout_s, cuda_available=cuda, gpu_count=gpus))
        except ConfigError as e:
            lines = [ln.removeprefix(f"{file}: ") for ln in str(e).splitlines()]
            if len(lines) == 1:
                return _refuse(f"sweep {file}: {lines[0]}; nothing was run")
            print(f"sweep.py: error: sweep {file}: {len(lines)} problem(s), nothing was run:", file=sys.stderr)
            for line in lines:
                print(f"  {line}", file=sys.stderr)
            return EXIT_CONFIG
    for sweep, file in zip(sweeps, a.sweep):  # where each sweep writes: a folder it can make, checked, not made
        flag = "--output" if a.output else "--output-root" if a.output_root else f"sweep {file}: output"
        try:
            if a.output_root:
                check_folder(flag, Path(a.output_root))
            check_folder(flag, sweep.output)  # (under --output-root: its folder of this sweep)
        except ConfigError as e:
            return _refuse(f"{e}; nothing was run")
    if a.only is not None:  # across every file: a glob names runs of one suite or another
        try:
            sweeps = select(sweeps, a.only)
        except ConfigError as e:
            return _refuse(f"{e}; nothing was run")
    if a.in_process and (multi := [r.name for sweep in sweeps for r in sweep.runs if r.processes > 1]):
        return _refuse(f"--in-process: runs of several processes ({', '.join(multi[:3])}): drop --in-process, or "
                       "keep to --devices 1 (--simulate-world for more ranks)")
    if a.dry_run:
        for run in (r for sweep in sweeps for r in sweep.runs):
            print(f"{run.name}: train_bench.py {' '.join(run.args)}")
        return 0
    main_fn = None
    if a.in_process:
        main_fn = _with_compile_cache(_train_bench_main())
        if line := compile_cache.load():  # compiled kernels of an earlier call (flux_cp/train/compile_cache.py)
            console.print(line, highlight=False, soft_wrap=True)
    bad = 0
    for sweep in sweeps:
        console.print(f"sweep {sweep.name}: {len(sweep.runs)} runs -> {sweep.output}/sweep.json", highlight=False)
        runner = Runner(sweep, console=console, in_process=main_fn)
        with _progress(console) as progress:
            bad += runner.run(progress)
        counts = {}
        for r in runner.records:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        console.print(f"sweep {sweep.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items())
                      + f"   index: {runner.index_path}", highlight=False, soft_wrap=True)
        console.print(f"report: python scripts/report.py {sweep.output}", highlight=False, soft_wrap=True)
        if runner.stop_signal is not None:
            left = bad + sum(len(later.runs) for later in sweeps[sweeps.index(sweep) + 1:])  # not ok, not run
            console.print(f"interrupted by {signal_name(runner.stop_signal)}: {left} run(s) not done; the same "
                          "command resumes (complete runs are kept, not run again):", highlight=False, soft_wrap=True)
            console.print(f"resume: {_command(argv)}", highlight=False, soft_wrap=True)
            return EXIT_INTERRUPTED
    return 1 if bad else 0


def _command(argv: list[str] | None) -> str:
    """This command line as it can be typed again here: this interpreter ("python" if that is what PATH finds), this
    script, the same arguments."""
    import os
    import shlex
    import shutil

    def here(path: str) -> str:
        rel = os.path.relpath(path)
        return path if rel.startswith("..") else rel

    exe = "python" if shutil.which("python") == sys.executable else here(sys.executable)
    args = sys.argv[1:] if argv is None else argv
    return shlex.join([exe, here(os.path.abspath(__file__)), *map(str, args)])


def _with_compile_cache(main_fn):
    """main_fn, then this process's compiled artifacts saved if the run compiled anything new (in its log): a call
    cut at its limit keeps what compiled before."""
    def run(argv):
        try:
            return main_fn(argv)
        finally:
            if line := compile_cache.save():
                print(line)

    return run


def _train_bench_main():
    """scripts/train_bench.py's main(argv), loaded as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_bench", Path(__file__).with_name("train_bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _progress(console):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), console=console)


if __name__ == "__main__":
    sys.exit(main())
