"""Bad input to every entry point (scripts/train_bench.py, sweep.py, plan.py, report.py): one line on stderr,
`<script>.py: error: <setting> <value>: <what is wrong and the fix>`, exit code 2, before any run starts, and
nothing left on disk: no folder made, no file replaced. Each row runs the script's main(argv) in this process
(tests/test_cli.py holds train_bench's settings checks; these rows are its inputs beside them)."""

import contextlib
import importlib.util
import io
import re
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, TINY, train_bench

SWEEP_CPU = ROOT / "configs" / "sweep_cpu.yaml"
W2 = ["--global-batch", "2", "--world", "2"]  # a plan cell of the tiny model: S144-B2-W2
FORM = re.compile(r"^(?P<script>\w+\.py): error: (--[\w.-]+|RUNS_DIR|sweep)[ :]")

# (entry point, argv, a fragment of the message); {tmp} is the test's folder, holding afile (empty), d/ (empty),
# rd/report (a file where the report's folder would go), plan/plan.json (another cell's), map/S1-B1-W1/plan.json
# (not JSON), root/sweep_cpu (a file where a sweep's folder would go) and one.yaml (a sweep with one problem)
ROWS = [
    ("train_bench", ["--steps", "-1"], "need steps >= 1"),
    ("train_bench", ["--devices", "0"], "--devices 0: must be >= 1"),
    ("train_bench", ["--timeout-s", "0"], "--timeout-s 0.0: must be > 0 seconds"),
    ("train_bench", ["--data.batch_size", "0"], "--data.batch_size 0: must be >= 1"),
    ("train_bench", ["--num-nodes", "0"], "--num-nodes 0: must be >= 1"),
    ("train_bench", ["--regions-every", "-1"], "--regions-every -1: >= 1"),
    ("train_bench", ["--idle-probe-every", "-1"], "--idle-probe-every -1: 0 (off) or >= 2"),
    ("train_bench", ["--model.mlp_ratio", "0"], "--model.mlp_ratio 0.0: must be > 0"),
    ("train_bench", ["--ops-only", "--reps", "0"], "--reps 0: must be >= 1"),
    ("train_bench", ["--timeout-s", "inf"], "--timeout-s inf: expected a number"),
    ("train_bench", ["--config", "{tmp}/d"], "--config {tmp}/d: a folder, not a YAML file"),
    ("train_bench", ["--config", "{tmp}/afile"], "--config {tmp}/afile: empty"),
    ("train_bench", ["--config", "{tmp}/nofile.yaml"], "--config {tmp}/nofile.yaml: file not found"),
    ("train_bench", ["--lr", "-1"], "--lr -1: AdamW's learning rate must be > 0"),
    ("train_bench", ["--lr", "0"], "--lr 0: AdamW's learning rate must be > 0"),
    ("train_bench", ["--fsdp-prefetch", "2"], "--fsdp-prefetch 2: tunes FSDP2, needs --weights fsdp (not ddp"),
    ("train_bench", ["--weights", "fsdp", "--fsdp-reshard-last", "9"], "--fsdp-reshard-last 9: a count of blocks in"),
    ("train_bench", ["--fsdp-reduce-dtype", "fp32"], "--fsdp-reduce-dtype fp32: tunes FSDP2, needs --weights fsdp"),
    ("train_bench", ["--fsdp-cpu-offload", "true"], "--fsdp-cpu-offload true: tunes FSDP2, needs --weights fsdp"),
    ("train_bench", ["--fp8", "rowwise"], "--fp8 rowwise: float8 GEMMs need a GPU with FP8 tensor cores"),
    ("train_bench", ["--fsdp-fp8-all-gather", "true"], "--fsdp-fp8-all-gather true: gathers the float8 linears'"),
    ("train_bench", ["--weights", "fsdp", "--fp8", "tensorwise", "--fsdp-fp8-all-gather", "true", "--fsdp-cpu-offload",
                     "true"], "--fsdp-fp8-all-gather true: casts each weight on its shard, which --fsdp-cpu-offload"),
    ("train_bench", ["--lora-rank", "-1"], "--lora-rank -1: the adapters' rank, >= 1 (0: full fine-tuning"),
    ("train_bench", ["--lora-rank", "4", "--lora-targets", "to_gate"], "--lora-targets to_gate: to_gate names none of"),
    ("train_bench", ["--lora-targets", "mlp"], "--lora-targets mlp: sets LoRA's adapters, needs --lora-rank"),
    ("train_bench", ["--lora-rank", "4", "--lora-alpha", "0"], "--lora-alpha 0: the adapters' scale numerator, > 0"),
    ("train_bench", ["--lora-rank", "4", "--devices", "2", "--cp", "tp"], "--lora-rank with --cp tp: the adapters"),

    ("plan", [*W2, "--output", "{tmp}/afile"],
     "--output {tmp}/afile: a file is in the way"),
    ("plan", [*W2, "--output", "{tmp}/afile/p"],
     "--output {tmp}/afile/p: {tmp}/afile is a file, not a folder"),
    ("plan", [*W2, "--output", "/proc/flux-cp-plan"],
     "--output /proc/flux-cp-plan: cannot create folders in /proc"),
    ("plan", ["--global-batch", "1", "--world", "1", "--output", "{tmp}/plan"],
     "--output {tmp}/plan: holds the plan of S144-B2-W2, not S144-B1-W1's"),
    ("plan", [*W2, "--link", "nolink"], "--link nolink: no such link profile"),
    ("plan", [*W2, "--fp8", "int4"], "--fp8 int4: int4 unknown (choose from none, tensorwise, rowwise"),
    ("plan", [*W2, "--lora-rank", "-2"], "--lora-rank -2: must be >= 0"),
    ("plan", [*W2, "--lora-rank", "8", "--lora-targets", "to_x"], "--lora-targets to_x: to_x names none of"),
    ("plan", [*W2, "--lora-targets", "mlp"], "--lora-targets mlp: sets LoRA's adapters, needs --lora-rank"),
    ("plan", [*W2, "--checkpointing", "some"], "--checkpointing some: some unknown (choose from none, selective"),
    ("plan", [*W2, "--link", "{tmp}/afile"], "--link {tmp}/afile: not a link profile"),
    ("plan", [*W2, "--memory-gib", "0"], "--memory-gib 0: must be a number of GiB > 0"),
    ("plan", [*W2, "--memory-gib", "nan"], "--memory-gib nan: must be a number"),
    ("plan", [*W2, "--steps", "0"], "--steps 0: must be >= 1"),
    ("plan", [*W2, "--warmup-steps", "-1"], "--warmup-steps -1: must be >= 0"),
    ("plan", [*W2, "--seq-len", "0"], "--seq-len 0: must be >= 1"),
    ("plan", [*W2, "--seq-len", "10"], "--seq-len 10: must exceed the 48 text"),
    ("plan", ["--global-batch", "x", "--world", "2"], "--global-batch x: expected an integer"),
    ("plan", ["--global-batch", "2", "--world", "0"], "--world 0: must be >= 1"),
    ("plan", [*W2, "--cp", "ring"], "--cp ring: ring unknown (choose from none"),
    ("plan", [*W2, "--weights", ""], "--weights '': give comma-separated names"),
    ("plan", [*W2, "--only", "dp9-ddp-eager"],
     "--only dp9-ddp-eager: no such plan in S144-B2-W2"),
    ("plan", ["--global-batch", "2", "--world", "4", "--only", "dp4-ddp-eager"],
     "--only dp4-ddp-eager: left out in S144-B2-W4: --data.global_batch 2"),
    ("plan", ["--global-batch", "3", "--world", "2", "--cp", "none"],
     "--seq-len 144 --global-batch 3 --world 2: none of its 5 plans can run (e.g. dp2-ddp-eager"),
    ("plan", ["--global-batch", "0", "--world", "2"], "--global-batch 0: must be >= 1"),
    ("plan", ["--cells", "144:2:2 144:2:2"], "--cells 144:2:2: named twice"),
    ("plan", ["--cells", "144:2:2", "--world", "2"], "--cells names each cell's S, B and W: drop"),
    ("plan", ["--cells", "144:2:2 144:1:2", "--only", "dp2-ddp-eager,dp3-ddp-eager"],
     "--only dp3-ddp-eager: no such plan in any cell"),
    ("plan", ["--cells", "144:2"], "--cells 144:2: each cell is S:B:W"),
    ("plan", ["--map", "{tmp}/afile"], "--map {tmp}/afile: not a folder"),
    ("plan", ["--map", "{tmp}/d"], "--map {tmp}/d: no <cell>/plan.json under it"),
    ("plan", ["--map", "{tmp}/map"], "--map {tmp}/map: {tmp}/map/S1-B1-W1/plan.json: unreadable"),
    ("plan", [*W2, "--bogus", "3"], "--bogus 3: unknown option"),
    ("plan", [], "--global-batch and --world are required"),

    ("sweep", ["{tmp}/nope.yaml"], "sweep {tmp}/nope.yaml: no such file (give a sweep YAML"),
    ("sweep", ["{tmp}/d"], "sweep {tmp}/d: a folder (give a sweep YAML"),
    ("sweep", ["{tmp}/afile"], "sweep {tmp}/afile: a sweep config is a mapping"),
    ("sweep", ["{tmp}/one.yaml", "--output", "{tmp}/o"], "sweep {tmp}/one.yaml: unknown key 'colour'"),
    ("sweep", [SWEEP_CPU, "--output", "{tmp}/afile", "--dry-run"], "--output {tmp}/afile: a file is in the way"),
    ("sweep", [SWEEP_CPU, "--output-root", "{tmp}/afile"], "--output-root {tmp}/afile: a file is in the way"),
    ("sweep", [SWEEP_CPU, "--output-root", "{tmp}/root", "--dry-run"],
     "--output-root {tmp}/root/sweep_cpu: a file is in the way"),
    ("sweep", [SWEEP_CPU, "--output", "/proc/flux-cp-sweep"], "--output /proc/flux-cp-sweep: cannot create folders"),
    ("sweep", [SWEEP_CPU, "--timeout-s", "0"], "--timeout-s 0: must be a number of seconds > 0"),
    ("sweep", [SWEEP_CPU, "--timeout-s", "nan"], "--timeout-s nan: must be a number of seconds > 0"),
    ("sweep", [SWEEP_CPU, "--gpus", "-1", "--dry-run"], "--gpus -1: must be >= 0"),
    ("sweep", [SWEEP_CPU, "--output", "{tmp}/o", "--only", "nothing-*"], "--only: nothing-* match(es) no run"),
    ("sweep", [SWEEP_CPU, "--output", "{tmp}/o", "--in-process"], "--in-process: runs of several processes"),
    ("sweep", [SWEEP_CPU, SWEEP_CPU, "--output", "{tmp}/o"], "--output takes one sweep"),
    ("sweep", [SWEEP_CPU, "--output", "{tmp}/o", "--output-root", "{tmp}/r"], "--output-root: not allowed with"),

    ("report", ["{tmp}/d", "--across", "rank"], "--across rank: rank unknown (choose from lora, checkpointing, fp8"),
    ("report", ["{tmp}/nope"], "RUNS_DIR {tmp}/nope: not a directory"),
    ("report", ["{tmp}/afile"], "RUNS_DIR {tmp}/afile: not a directory"),
    ("report", ["{tmp}/d"], "RUNS_DIR {tmp}/d: no summary.json found"),
    ("report", ["{tmp}/d", "--out", "{tmp}/afile"], "--out {tmp}/afile: a file is in the way"),
    ("report", ["{tmp}/d", "--out", "{tmp}/afile/r"], "--out {tmp}/afile/r: {tmp}/afile is a file, not a folder"),
    ("report", ["{tmp}/d", "--out", "/proc/flux-cp-report"], "--out /proc/flux-cp-report: cannot create folders"),
    ("report", ["{tmp}/rd"], "RUNS_DIR {tmp}/rd: its report folder {tmp}/rd/report: a file is in the way"),
    ("report", ["{tmp}/d", "--link", "nolink"], "--link nolink: no such link profile"),
    ("report", ["{tmp}/d", "--cpu-link", "{tmp}/afile"], "--cpu-link {tmp}/afile: not a link profile"),
    ("report", ["{tmp}/d", "--cpu-link", "{tmp}/d"], "--cpu-link {tmp}/d: a folder, not a link profile"),
    ("report", ["{tmp}/d", "--link-gbps", "inf"], "--link-gbps inf: must be a number of GB/s > 0"),
    ("report", ["{tmp}/d", "--wandb-mode", "x"], "--wandb-mode x: choose one of offline, online, disabled"),
    ("report", [], "RUNS_DIR: required"),
]


def _script(name: str):
    """scripts/<name>.py as a module, loaded once (as scripts/sweep.py loads train_bench)."""
    if name == "train_bench":
        return train_bench()
    key = f"{name}_script_under_test"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "scripts" / f"{name}.py")
        sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[key])
    return sys.modules[key]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture
def tmp(tmp_path):
    (tmp_path / "afile").write_text("")
    (tmp_path / "d").mkdir()
    (tmp_path / "rd").mkdir()
    (tmp_path / "rd" / "report").write_text("not a folder\n")
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "plan.json").write_text('{"cell": "S144-B2-W2", "plans": []}\n')
    (tmp_path / "map" / "S1-B1-W1").mkdir(parents=True)
    (tmp_path / "map" / "S1-B1-W1" / "plan.json").write_text("{")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "sweep_cpu").write_text("")  # where --output-root would put configs/sweep_cpu.yaml's runs
    (tmp_path / "one.yaml").write_text(f"config: {TINY}\ncolour: blue\naxes:\n  devices: [1]\n")
    return tmp_path


@pytest.mark.parametrize(("entry", "argv", "fragment"), ROWS,
                         ids=[f"{e}-{i}" for i, (e, *_) in enumerate(ROWS)])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(entry, argv, fragment, tmp, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = [str(a).replace("{tmp}", str(tmp)) for a in argv]
    if entry == "train_bench":  # refused before its folder is claimed: no run starts, no folder is made
        argv += ["--output", str(tmp / "run"), "--wandb-mode", "disabled"]
    if entry == "plan" and "--map" not in argv:  # the tiny model's cells on a GPU too (S144: its 48 + 96 tokens)
        argv = ["--config", str(TINY), *argv]
    main = _script(entry).main
    before = _tree(tmp)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's own errors
            rc = e.code
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    assert rc == 2, (rc, err.getvalue()[-2000:])
    assert len(lines) == 1, err.getvalue()
    line = lines[0]
    assert (m := FORM.match(line)) and m["script"] == f"{entry}.py", line
    assert fragment.replace("{tmp}", str(tmp)) in line, line
    assert "Traceback" not in err.getvalue() + out.getvalue()
    assert _tree(tmp) == before  # nothing made, nothing replaced


def test_every_script_has_rows_enough():
    counts = {e: sum(r[0] == e for r in ROWS) for e in ("train_bench", "plan", "sweep", "report")}
    assert min(counts.values()) >= 6, counts


@pytest.mark.parametrize("name", ["plan", "sweep", "report"])
def test_help_ends_in_sentences(name):
    """--help's description is whole sentences, and no option's help trails off in a comma or a colon."""
    p = _script(name).parser()
    assert p.description.endswith((".", "?")) and "\n" not in p.description, p.description
    for action in p._actions:
        text = " ".join((action.help or "").split())
        assert text and text[-1] not in ",;:-(" and text.count("(") == text.count(")"), (action.dest, text)
