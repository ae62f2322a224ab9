# `make demo` and `make test` each do all the set-up on a fresh machine: a virtualenv in .venv,
# torch 2.13.0 first (the CPU build on this machine's disk; resolving torch freely pulls a CUDA
# build of several GB), then the project with every extra.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[all,dev]"
	touch $(STAMP)

.PHONY: install demo test bench bench-full
install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) -m benchmarks --quick

bench-full: $(STAMP)
	$(PY) -m benchmarks --full
