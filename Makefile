# LibreYOLO training service. `make demo` and `make test` work on a fresh machine.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make demo` knobs: DATA (your data.yaml; default the easy synthetic set), MODEL, EPOCHS
# (pre-training), FT_EPOCHS (fine-tuning from the published model; 0 skips it), IMGSZ,
# BATCH, THREADS (CPU threads per engine process; 1 by default: more threads than free
# cores stall every step on a busy machine; 0 = torch's default), PROFILE=0 (no profile
# job), WAIT=0 (stop the service at the end instead of keeping it up until Ctrl-C), PORT
# (the service's port; default: a free one).
DATA ?=
MODEL ?= yolo9-t
EPOCHS ?= 30
FT_EPOCHS ?= 5
IMGSZ ?= 128
BATCH ?= 8
THREADS ?= 1
PROFILE ?= 1
WAIT ?= 1
PORT ?= 0
LIBREYOLO_REF := 1.6.0

.PHONY: setup test test-slow test-all test-fast demo bench gpu-check lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch/torchvision from the configured index. The torch 2.14.1 wheel there is the CUDA
	# build: pip also installs ~15 nvidia-* wheels and triton (several GB) even on a machine
	# without a GPU. No CPU-only 2.14.1 wheel is reachable from this machine's indexes
	# (checked with `pip install --dry-run torch==2.14.1`).
	$(BIN)/pip install torch==2.14.1 torchvision==0.29.1
	# (a reference libreyolo once installed into the venv itself took over bin/libreyolo)
	$(BIN)/pip uninstall -y -q libreyolo 2>/dev/null || true
	$(BIN)/pip install -e '.[dev,ref,onnx,tensorboard,mlflow]'
	# test-only reference library, in its own folder that only the tests put on sys.path
	# (tests/conftest.py): installed into the venv, its `libreyolo` command would replace
	# ours. Without its dependencies: it pins opencv-python, which clashes with our
	# opencv-python-headless; what it imports is in the `ref` extra.
	$(BIN)/pip install -q --no-deps --upgrade --target $(VENV)/reference libreyolo==$(LIBREYOLO_REF)
	touch $(STAMP)

# `make test`: every test but those marked `slow` (real training runs, DDP, Slurm, worker
# recoveries; `--no-slow`, tests/conftest.py), and its closing line counts them. `make
# test-slow` runs those, `make test-all` both in one session (as plain `pytest tests` does);
# `.ci/run` runs `make test` and `make test-slow`.
test: setup
	$(BIN)/python -m pytest tests --no-slow --durations=20

test-slow: setup
	$(BIN)/python -m pytest tests -m slow --durations=20

test-all: setup
	$(BIN)/python -m pytest tests --durations=40

test-fast: test

# the service end to end through the SDK: `libreyolo-service up`, pre-train, publish the
# weights as a model, fine-tune from it, a profile job; the service stays up (Ctrl-C stops it)
demo: setup
	$(BIN)/python -m libreyolo_client.demo $(if $(DATA),--data $(DATA),) --model $(MODEL) \
		--epochs $(EPOCHS) --ft-epochs $(FT_EPOCHS) --imgsz $(IMGSZ) --batch $(BATCH) \
		--threads $(THREADS) --port $(PORT) \
		$(if $(filter 0,$(PROFILE)),--no-profile,) $(if $(filter 0,$(WAIT)),--no-wait,)

bench: setup
	$(BIN)/python bench/data_throughput.py

# everything that needs a GPU, for the first GPU machine (under 8 minutes on one GPU): the
# CUDA-only tests, the CUDA-graph step bench (yolo9-t, yolox-t), the profiler on a
# launch-bound and a compute-bound case, a 1-GPU DDP (NCCL) smoke run. One JSON report
# (runs/gpu_check/gpu_check.json) and a summary line; without a GPU: "no GPU: skipped", exit 0.
gpu-check: setup
	$(BIN)/python bench/gpu_check.py

# ruff, then mypy on the four packages (config and the baseline's not-yet-fixed modules:
# pyproject.toml [tool.mypy]); both must pass with zero findings
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache runs .libreyolo
