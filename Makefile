# Two commands do all set-up on a fresh machine with Python 3.11:
#   make run    creates .venv on first use, installs, runs `dagrag evaluate` on the embedded sample
#   make test   creates .venv on first use, installs, runs the test suite
# Installing puts the `dagrag` command in .venv/bin (pyproject's [project.scripts]): run it as
# .venv/bin/dagrag COMMAND [overrides], or as plain `dagrag` after `source .venv/bin/activate`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help run test test-slow install bytecode clean-artifacts ui-screenshot

help:
	@echo "make run [ARGS='method=bm25 ...']   install on first use, then dagrag evaluate on the embedded sample"
	@echo "make test [ARGS=...]                install on first use, then the test suite (two workers)"
	@echo "make test-slow                      the benchmark-sized tests on ../shared/datasets"
	@echo "make install                        create .venv and install (torch's CPU wheel first)"
	@echo "make ui-screenshot                  a Prefect server, one run, headless Chromium screenshots"
	@echo "make clean-artifacts                remove stage outputs and the catalog (keeps the LLM cache)"
	@echo "Commands: .venv/bin/dagrag --help"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# the local CPU wheel of torch, before anything that depends on torch
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP) bytecode
	$(VENV)/bin/dagrag evaluate $(ARGS)

# two pytest-xdist workers, one test file each at a time: most flow tests wait on a Prefect server or a child
# process for part of their run (11-12 minutes with two on the box of 2026-11-25, 8-10 on that of 2026-11-26,
# 6.8 here and 8 in a fresh clone on 2026-11-27; three workers were no faster)
test: $(STAMP) bytecode
	$(PY) -m pytest -q -n 2 --dist loadfile $(ARGS)

# the project's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (as on this box) every command and
# every test's child process otherwise compiles flows/ and tasks/ again on import (0.6-0.8 s of a start-up here)
bytecode: $(STAMP)
	$(PY) -m compileall -q flows tasks

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(ARGS)

# a Prefect server with its UI, one evaluate run (twice: the second is all cached), headless Chromium
# screenshots of the run's page and its artifacts in artifacts/ui-*.png (needs: apt-get install -y chromium)
ui-screenshot: $(STAMP)
	$(PY) -m flows.commands.ui_screenshot $(ARGS)

clean-artifacts:
	rm -rf artifacts/*/ artifacts/catalog.duckdb artifacts/.catalog.lock
