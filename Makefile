# Two commands do all set-up on a fresh machine with Python 3.11:
#   make run    creates .venv on first use, installs, runs flows.evaluate on the embedded sample
#   make test   creates .venv on first use, installs, runs the test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-slow install clean-artifacts

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# the local CPU wheel of torch, before anything that depends on torch
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m flows.evaluate $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(ARGS)

clean-artifacts:
	rm -rf artifacts/*/ artifacts/catalog.duckdb artifacts/.catalog.lock
