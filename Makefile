.PHONY: setup test test-fast test-gpu test-gpu-serve lint typecheck format

setup:
	python3 -m venv .venv && . .venv/bin/activate && python -m pip install -c constraints.txt -e ".[dev]"

test:
	. .venv/bin/activate && python -m pytest -q

test-fast:
	. .venv/bin/activate && python -m pytest -q -m "not slow"

# On a CUDA GPU machine: the GPU tier (bench/gpu_check.sh's tests stage) in two halves, each meant to fit one
# 10-minute call: kernels, engine and whole models; then the server and labeling client.
test-gpu:
	STAGES=tests bash bench/gpu_check.sh

test-gpu-serve:
	STAGES=tests TEST_TIER=serve bash bench/gpu_check.sh

lint:
	. .venv/bin/activate && ruff check yolojet tests bench && ruff format --check yolojet tests bench

typecheck:
	. .venv/bin/activate && python -m mypy

format:
	. .venv/bin/activate && ruff format yolojet tests bench && ruff check --fix yolojet tests bench
