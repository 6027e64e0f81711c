# Two commands do all the set-up: `make serve` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build on this machine's disk; on a GPU box: make serve TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: serve test bench system-deps dev-model fixtures turn-model

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) scripts/fetch_turn_model.py
	touch $(STAMP)

system-deps:
	scripts/system-deps.sh

serve: $(STAMP)
	scripts/system-deps.sh serve
	$(VENV)/bin/omni-rtc serve $(ARGS)

test: $(STAMP) system-deps turn-model
	$(VENV)/bin/ruff check app media pipeline tests scripts
	$(VENV)/bin/mypy
	scripts/run-offline.sh $(VENV)/bin/pytest $(PYTEST_ARGS)

# semantic_vad's end-of-turn model, from the pipecat-ai wheel on PyPI (the venv build runs it too).
turn-model: $(STAMP)
	$(PY) scripts/fetch_turn_model.py

dev-model: $(STAMP)
	$(VENV)/bin/omni-rtc dev-model

fixtures: $(STAMP) system-deps
	$(PY) tests/fixtures/make_fixtures.py
	$(PY) tests/fixtures/turns/make_turns.py
