# One command for everything: `make test` builds/updates .venv from pyproject.toml, then runs
# ruff, mypy --strict and pytest.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck unit dev clean docs

test: lint typecheck unit

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	tree=$$(tools/typecheck-tree.sh) && cd $$tree && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p conveyor

unit: $(STAMP)
	$(BIN)/pytest -q

# The docs site (docs/, mkdocs.yml) with the API reference from the docstrings, into .build/site.
docs: $(STAMP)
	tools/typecheck-tree.sh >/dev/null && $(BIN)/mkdocs build --strict

dev: $(STAMP)
	$(BIN)/conveyor dev --app examples.shop:app

clean:
	rm -rf $(VENV) .build
