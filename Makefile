# One command for everything: `make test` builds/updates .venv from pyproject.toml, then runs
# ruff, mypy --strict and pytest. The venv has devtools/ too (bench, chaos: not in the wheel).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# faust-streaming pins croniter<6 and click<8.4, older than the schedules need, so it goes in
# beside them without its pins (conveyor.faust uses its records and codecs only).
FAUST := 'faust-streaming>=0.11' mode-streaming aiohttp-cors intervaltree terminaltables venusian colorlog mypy-extensions six

.PHONY: test lint typecheck unit dev clean docs

test: lint typecheck unit

$(STAMP): pyproject.toml devtools/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q -e devtools
	$(BIN)/pip install -q --no-deps $(FAUST)
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	tree=$$(tools/typecheck-tree.sh) && cd $$tree && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p conveyor -p conveyor_devtools

unit: $(STAMP)
	$(BIN)/pytest -q

# The docs site (docs/, mkdocs.yml) with the API reference from the docstrings, into .build/site.
docs: $(STAMP)
	tools/typecheck-tree.sh >/dev/null && $(BIN)/mkdocs build --strict

dev: $(STAMP)
	$(BIN)/conveyor dev --app examples.shop:app

clean:
	rm -rf $(VENV) .build
