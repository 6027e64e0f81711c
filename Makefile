# Two commands do all the set-up: `make serve` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build on this machine's disk; on a GPU box: make serve TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist processes, each taking a whole test file at a time (--dist loadfile: a module's
# server is started once); `make test` runs that many for the real-time tests and as many for
# tests/pipeline/local, beside them at a lower priority (scripts/test-tiers.sh says why).
# More processes starved the real-time tests on this 2-core box. 0: no xdist.
TEST_PROCESSES ?= 2
# The OpenAI Agents JS SDK for tests/e2e/test_tools.py, pinned by its package-lock.json.
SDK_DIR := tests/e2e/sdk
SDK_STAMP := $(SDK_DIR)/node_modules/.installed
# pipecat, LiveKit Agents and the OpenAI Agents SDK for tests/e2e/frameworks, in a venv of their
# own (their pins clash with the server's: websockets<17, protobuf<7), every package pinned.
FW_VENV := .venv-frameworks
FW_REQUIREMENTS := tests/e2e/frameworks/requirements.txt
FW_STAMP := $(FW_VENV)/.installed

.PHONY: serve test test-unit bench system-deps dev-model fixtures turn-model frameworks-venv

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

test: $(STAMP) system-deps turn-model $(SDK_STAMP) $(FW_STAMP)
	$(VENV)/bin/ruff check app media pipeline tests scripts
	$(VENV)/bin/mypy
ifeq ($(strip $(PYTEST_ARGS)),)
	scripts/test-tiers.sh $(TEST_PROCESSES)
else
	scripts/run-offline.sh $(VENV)/bin/pytest -n $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS)
endif

# The tiers below the end-to-end tests (tests/e2e: real servers, peers and browsers), less the
# tests that compute with the dev model (marked dev_model), for a quick round
# while editing: no root, no Chromium, no real-time audio; `make test` still runs everything. Its
# one system package is the server's own libopus0 (media/libopus.py), checked, not installed.
test-unit: $(STAMP) turn-model
	@$(PY) -c 'import ctypes.util, sys; sys.exit(ctypes.util.find_library("opus") is None)' || \
		{ echo "make test-unit: Debian's libopus0 is missing (sudo apt-get install libopus0)" >&2; exit 1; }
	$(VENV)/bin/ruff check app media pipeline tests scripts
	$(VENV)/bin/mypy
	scripts/run-offline.sh $(VENV)/bin/pytest -n $(TEST_PROCESSES) --dist loadfile --ignore=tests/e2e -m "not dev_model" $(PYTEST_ARGS)

# Only the SDK's self-contained browser build is used: no install scripts need to run.
$(SDK_STAMP): $(SDK_DIR)/package.json $(SDK_DIR)/package-lock.json | system-deps
	npm ci --prefix $(SDK_DIR) --ignore-scripts --no-audit --no-fund
	touch $(SDK_STAMP)

# --no-deps: the requirements file pins the whole tree, so nothing else is resolved or fetched.
$(FW_STAMP): $(FW_REQUIREMENTS)
	rm -rf $(FW_VENV)
	python3 -m venv $(FW_VENV)
	$(FW_VENV)/bin/pip install --quiet --no-deps -r $(FW_REQUIREMENTS)
	touch $(FW_STAMP)

frameworks-venv: $(FW_STAMP)

# semantic_vad's end-of-turn model, from the pipecat-ai wheel on PyPI (the venv build runs it too).
turn-model: $(STAMP)
	$(PY) scripts/fetch_turn_model.py

# DEPTH=real: the real model's layer and expert counts at the dev model's tiny widths (docs/MODEL.md).
DEPTH ?= tiny
dev-model: $(STAMP)
	$(VENV)/bin/omni-rtc dev-model --depth $(DEPTH)

fixtures: $(STAMP) system-deps
	$(PY) tests/fixtures/make_fixtures.py
	$(PY) tests/fixtures/turns/make_turns.py
