# LibreYOLO training service. `make demo` and `make test` work on a fresh machine.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA ?=
LIBREYOLO_REF := 1.6.0

.PHONY: setup test test-fast demo bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch/torchvision: plain pip takes the local wheels (no CUDA download)
	$(BIN)/pip install torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -e '.[dev,ref]'
	# test-only reference library: without its dependencies (it pins opencv-python, which
	# clashes with our opencv-python-headless); what it imports is in the `ref` extra
	$(BIN)/pip install --no-deps libreyolo==$(LIBREYOLO_REF)
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest tests

test-fast: setup
	$(BIN)/python -m pytest tests -m "not slow"

# the service end to end: `libreyolo-service up`, a train and a profile job through the SDK
demo: setup
	$(BIN)/python -m libreyolo_client.demo $(if $(DATA),--data $(DATA),)

bench: setup
	$(BIN)/python bench/data_throughput.py

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache runs .libreyolo
