# Quick start: `make bench` (set-up + the main job on its default), `make test` (set-up + the CPU tests; CI also
# runs `make test-slow`: the fault cases, sweeps of real runs, compiling on the CPU; `make test-peft` and
# `make test-fp8`: LoRA against peft, torchao's float8 on the CPU).
PY ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	# The CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build. The wheel alone (--no-deps):
	# one already on disk (pip's find-links) without asking any index, else PyTorch's CPU index; its dependencies
	# come with the project's below, from the usual indexes (torch in place, no CUDA build is pulled).
	$(BIN)/pip install -qq --no-index --no-deps "torch==2.13.0" 2>/dev/null || \
		$(BIN)/pip install -qq --no-deps "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu

# the project and its dependencies, again whenever pyproject.toml changes (an older .venv gets what is new)
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -qq -e ".[dev]"  # -qq: a machine's unused extra indexes would warn for every package
	touch $@

setup: $(VENV)/.installed

bench: setup
	$(BIN)/python scripts/train_bench.py $(ARGS)

test: setup  # the CPU tests but the slow set (CI runs both sets: .ci/run); two workers, a test
	# file each (its module fixtures run once): most tests wait on single-threaded start-ups of train_bench processes
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not gpu and not multigpu and not slow and not peft and not fp8" --durations=10 $(ARGS)

test-slow: setup  # hung and killed ranks, interrupts, sweeps of real runs (OOM, resume), compiling on the CPU
	$(BIN)/python -m pytest -q -n 2 -m "slow and not peft and not fp8" --durations=10 $(ARGS)  # two at a time: the hung-rank cases mostly wait

test-peft: setup  # --lora-rank's adapters against peft's own: peft in for these tests only (it slows every import)
	$(BIN)/pip install -qq -e ".[peft]"
	rc=0; $(BIN)/python -m pytest -q -m peft $(ARGS) || rc=$$?; $(BIN)/pip uninstall -qq -y peft transformers; exit $$rc

test-fp8: setup  # torchao's float8 training on the CPU (the full fine-tune's FP8, FSDP's float8 all-gather over gloo)
	$(BIN)/pip install -qq -e ".[fp8]"
	rc=0; $(BIN)/python -m pytest -q -m fp8 $(ARGS) || rc=$$?; $(BIN)/pip uninstall -qq -y torchao; exit $$rc

lint: setup
	$(BIN)/ruff check .

.PHONY: setup bench test test-slow test-peft test-fp8 lint
