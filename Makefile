# The two commands of the README: `make up` runs the product, `make test` runs the whole suite.
.PHONY: install up test lint typecheck unit e2e bench bench-cold clean

VENV := .venv/bin

install:
	@scripts/install.sh

up: install
	@$(VENV)/switchboard up

lint: install
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .

typecheck: install
	$(VENV)/mypy

test: install
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	$(VENV)/mypy
	$(VENV)/pytest

unit: install
	$(VENV)/pytest -m "not e2e"

e2e: install
	$(VENV)/pytest -m e2e

bench: install
	$(VENV)/python bench/path_overhead.py

bench-cold: install
	$(VENV)/python bench/cold_start.py

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
