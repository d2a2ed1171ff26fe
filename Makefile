# Shortcuts; each target does its own set-up from a fresh clone.
PYTHON ?= python3
VENV ?= .venv
OUT ?= dpfl-audit-out

.PHONY: install demo test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/dpfl-audit run --out $(OUT)
	@echo "report written to $(OUT)/report.html"

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

bench: $(VENV)/.installed
	$(VENV)/bin/python benchmarks/engine_throughput.py

clean:
	rm -rf $(OUT) .pytest_cache .ruff_cache
