.PHONY: setup test test-fast test-gpu lint typecheck format

setup:
	python3 -m venv .venv && . .venv/bin/activate && python -m pip install -c constraints.txt -e ".[dev]"

test:
	. .venv/bin/activate && python -m pytest -q

test-fast:
	. .venv/bin/activate && python -m pytest -q -m "not slow"

# On a CUDA GPU machine: the GPU tier (bench/gpu_check.sh's tests stage, 16 pytest-xdist workers): kernels, engine,
# whole models, the server and the labeling client, in one 10-minute call (3:39 on an H200).
test-gpu:
	STAGES=tests bash bench/gpu_check.sh

lint:
	. .venv/bin/activate && ruff check yolojet tests bench && ruff format --check yolojet tests bench

typecheck:
	. .venv/bin/activate && python -m mypy

format:
	. .venv/bin/activate && ruff format yolojet tests bench && ruff check --fix yolojet tests bench
