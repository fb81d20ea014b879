# Quick start: `make bench` (set-up + the main job on its default), `make test` (set-up + the CPU tests; CI also
# runs `make test-slow`, the slow fault and sweep cases).
PY ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q --retries 1 --timeout 10 "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu || $(BIN)/pip install -q "torch==2.13.0"

# the project and its dependencies, again whenever pyproject.toml changes (an older .venv gets what is new)
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

bench: setup
	$(BIN)/python scripts/train_bench.py $(ARGS)

test: setup  # the CPU tests but the slow fault and sweep cases (CI runs both sets: .ci/run); two workers, a test
	# file each (its module fixtures run once): most tests wait on single-threaded start-ups of train_bench processes
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not gpu and not multigpu and not slow"

test-slow: setup  # hung and killed ranks, a sweep's out-of-memory run and resume
	$(BIN)/python -m pytest -q -m slow

lint: setup
	$(BIN)/ruff check .

.PHONY: setup bench test test-slow lint
