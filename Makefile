# Every target bootstraps its own virtual environment from pyproject.toml.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: demo test check test-lowest lint typecheck pytest quick-pytest format diagrams screenshots bench thorough clean

PHASE := scripts/phase.sh

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(STAMP_RUN)

demo: $(STAMP_RUN)
	$(BIN)/agent-fsm demo

test: $(STAMP_DEV) lint typecheck pytest

# A quick answer before `make test`: lint, types, and the suite without its slow groups
# (real worker processes, DBOS, PostgreSQL crash tests), with few examples per property.
check: $(STAMP_DEV) lint typecheck quick-pytest

lint: $(STAMP_DEV)
	@$(PHASE) lint "ruff check and ruff format --check" -- sh -c '$(BIN)/ruff check agent_fsm tests examples benchmarks && $(BIN)/ruff format --check agent_fsm tests examples benchmarks'

typecheck: $(STAMP_DEV)
	@$(PHASE) typecheck "mypy --strict on the package; minutes on a fresh clone, whose cache is empty" -- $(BIN)/mypy

# Both cores (pytest-xdist): the CI profile plays over 10,000 generated agent runs.
pytest: $(STAMP_DEV)
	@$(PHASE) pytest "the whole suite, the CI profile" -- $(BIN)/pytest -n auto

quick-pytest: $(STAMP_DEV)
	@HYPOTHESIS_PROFILE=quick $(PHASE) quick-pytest "without the slow groups, few examples" -- $(BIN)/pytest -n auto -q -m "not slow"

# The suite against the lowest version of every dependency pyproject.toml allows (its lower
# bounds are promises to users: this holds them). uv resolves the floors; transitive
# dependencies stay at their newest. Its own environment, rebuilt each time.
VENV_LOWEST := .venv-lowest
test-lowest:
	rm -rf $(VENV_LOWEST)
	$(PYTHON) -m venv $(VENV_LOWEST)
	$(VENV_LOWEST)/bin/python -m pip install --quiet 'uv>=0.5'
	VIRTUAL_ENV=$(VENV_LOWEST) $(VENV_LOWEST)/bin/uv pip install --quiet \
		--resolution lowest-direct -e '.[dev]'
	$(VENV_LOWEST)/bin/python -m pip list --format=freeze | grep -iE \
		'^(transitions|openai|pydantic|jsonschema|docstring.parser|structlog|pytest|pytest.asyncio|pytest.xdist|hypothesis|hypothesis.jsonschema|mypy|opentelemetry.api|opentelemetry.sdk|mcp|anthropic|google.genai|httpx|httpx2|psycopg|psycopg.binary|dbos|starlette|uvicorn|selenium)=='
	$(VENV_LOWEST)/bin/pytest -q -n auto

# The thorough hypothesis profile: many more examples; run by hand.
thorough: $(STAMP_DEV)
	HYPOTHESIS_PROFILE=thorough $(BIN)/pytest -q -n auto tests/test_properties.py

format: $(STAMP_DEV)
	$(BIN)/ruff format agent_fsm tests examples benchmarks
	$(BIN)/ruff check --fix agent_fsm tests examples benchmarks

# The README's pictures of `agent-fsm ui`, taken by its browser test (Debian's chromium and
# chromium-driver), so that they show the ui as it is.
screenshots: $(STAMP_DEV)
	AGENT_FSM_SCREENSHOTS=1 $(BIN)/pytest -q -p no:cacheprovider tests/test_ui_browser.py -k step_through

# agent.svg needs graphviz's `dot`; without it the SVG is left as it is (its drift test checks
# the DOT source it was drawn from, so it still fails if the table changed).
diagrams: $(STAMP_RUN)
	$(BIN)/agent-fsm diagram --format mermaid -o diagrams/agent.mmd
	$(BIN)/agent-fsm diagram --format dot -o diagrams/agent.dot
	$(BIN)/agent-fsm diagram --table examples/plan_execute.py:TABLE -o diagrams/plan_execute.mmd
	$(BIN)/agent-fsm diagram --table examples/judged_answers.py:TABLE -o diagrams/judged_answers.mmd
	@if command -v dot >/dev/null 2>&1; then \
		$(BIN)/agent-fsm diagram --format svg -o diagrams/agent.svg; \
	else \
		echo "graphviz not found: diagrams/agent.svg not regenerated" \
			"(apt-get install graphviz / brew install graphviz)" >&2; \
	fi

bench: $(STAMP_RUN)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) $(VENV_LOWEST) .pytest_cache .mypy_cache .ruff_cache .hypothesis
