# `make demo` and `make test` each do all the set-up on a fresh machine: a virtualenv in .venv,
# torch 2.13.0 first (the CPU build on this machine's disk; resolving torch freely pulls a CUDA
# build of several GB), then the project with every extra, then every installed module byte-compiled on all
# cores at once (pip's own compiling, file by file on one core, is off: --no-compile). Compiled at install, not
# left to the first process that imports a module: where PYTHONDONTWRITEBYTECODE is set (it is on these
# machines) no process would write its bytecode, and each would compile all it imports again: 5 s of CPU for
# `import lightning` (10 s uncompiled), 1.3 s for `import torch` (2.5 s), in every process the suite starts.
# (compile_dir's result is not checked: a few test files of torch are in Python 3.12's syntax, never imported.)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -e ".[all,dev]"
	$(PY) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_path('purelib'), quiet=2, workers=0)"
	touch $(STAMP)

.PHONY: install demo test test-fast bench bench-full bench-venv
install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# The suite's test files on TEST_WORKERS processes (pytest-xdist), each file on one worker (its module
# fixtures run once), in the order of tests/conftest.py: the longest files first.
# --no-loadscope-reorder keeps that order (pytest-xdist would hand the files out by test count, and a
# long file with few tests would start last, the other worker idle).
# One worker more than cores does not speed the slow pass (-n 3 on 2 idle cores: 2,017 s against 1,909 s at -n 2,
# 2026-12-03): its subprocesses already keep both cores busy.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The inner loop (its budget: 3 minutes on 2 cores): every test not marked slow (each module's unit, property and
# twin tests; the multi-process, SIGKILL and framework-launch tests are the slow ones), with a tenth of
# each hypothesis budget (the fast profile, tests/helpers.py: scaled_examples). BUDGET=full: each test's whole budget.
BUDGET ?= fast
test-fast: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "not slow" --hypothesis-profile $(BUDGET)

# The whole suite, each test once: first `make test-fast` at the full hypothesis budget, then, only if it passes,
# the slow tests (multi-process, SIGKILL, framework launches): a broken build fails in minutes.
test: $(STAMP)
	$(MAKE) test-fast BUDGET=full
	$(PY) -m pytest $(XDIST) -m slow

# The stream benchmark's peers (litdata, mosaicml-streaming, HF datasets with torchdata) in a venv
# of their own: in .venv they would replace torch 2.13.0 (docs/streaming.md, "Side by side").
# `python -m benchmarks` runs them from here, and skips them with a printed reason without it.
BENCH_VENV ?= .bench-venv
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP):
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check torch==2.13.0 numpy==2.4.6 pyarrow==26.0.1 \
		litdata==0.2.76 mosaicml-streaming==0.10.0 datasets==5.0.1 torchdata==0.11.0
	$(BENCH_VENV)/bin/pip uninstall --quiet -y torchvision
	touch $(BENCH_STAMP)

bench-venv: $(BENCH_STAMP)

bench: $(STAMP) $(BENCH_STAMP)
	$(PY) -m benchmarks --quick

bench-full: $(STAMP) $(BENCH_STAMP)
	$(PY) -m benchmarks --full
