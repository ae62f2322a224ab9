from __future__ import annotations

import os
import resource
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], derandomize=True
)
PROFILE = "ci" if os.environ.get("CI") else "default"
settings.load_profile(PROFILE)
# `make test-fast` runs with --hypothesis-profile fast: a tenth of each budget given by tests.helpers.examples.
settings.register_profile("fast", parent=settings.get_profile(PROFILE), max_examples=10)
# `make test` runs `make test-fast` with --hypothesis-profile full: this environment's profile, every budget whole.
settings.register_profile("full", parent=settings.get_profile(PROFILE))


# The longest files, started first in this order (from `pytest --durations`): the slow pass's few long multi-process
# runs, then the files of the longest tests not marked slow (their hypothesis budgets). By their count of tests
# they would start late, and the last of them run alone at the end of its pass, the other worker idle.
LONGEST = (
    "docs/test_examples.py",  # the slow pass, idle 2 cores (--durations, 2026-12-03): 396 s
    "integrations/test_ray.py",  # 298 s
    "lightning/test_crash.py",  # 232 s
    "verify/test_verify_command.py",  # 197 s
    "docs/test_release.py",  # 183 s
    "verify/test_verify_resize.py",  # 164 s
    "lightning/test_verify.py",  # 159 s
    "stream/test_stream_lightning.py",  # 150 s
    "core/test_sampler_resume.py",  # the first pass's longest
    "lightning/test_callback_resume.py",
    "core/test_twin_loader.py",
    "docs/test_code_blocks.py",
    "core/test_resume_model.py",
    "core/test_sampler_contracts.py",
)


@pytest.hookimpl(trylast=True)  # after -m has deselected: the order is of the tests that run
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (``LONGEST``), then the files with the most slow (multi-process) tests, then
    those with the most tests, each file's tests in their own order. ``make test`` runs the files on 2 workers
    (``pytest -n 2 --dist loadfile --no-loadscope-reorder``: pytest-xdist would otherwise hand them out by test
    count), in this order: the long files start first and the short ones fill in at the end, instead of a
    long file starting last while the other worker has nothing left to do."""
    tests_root = Path(__file__).parent
    longest = {tests_root / name: rank for rank, name in enumerate(LONGEST)}
    missing = [name for name in LONGEST if not (tests_root / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST names files that do not exist: {missing}")
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    tests = Counter(item.path for item in items)
    items.sort(key=lambda item: (longest.get(item.path, len(LONGEST)), -slow[item.path], -tests[item.path]))


# Each test leaves the process's signal handlers as it found them. A Lightning fit stopped by an exception before its
# teardown (tests/stream/test_stream_lightning.py, the stream's error) leaves Lightning's SIGTERM handler installed,
# and a process forked later in the same worker inherits it: a multiprocessing pool's terminate() then hangs on a
# worker that catches its SIGTERM.
_RESTORED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    handlers = {number: signal.getsignal(number) for number in _RESTORED_SIGNALS}
    yield
    for number, handler in handlers.items():
        if handler is not None and signal.getsignal(number) is not handler:  # None: set outside Python, kept
            signal.signal(number, handler)


# `--cpu-report N`: the N tests that cost the most CPU (their own process's and their children's: the subprocesses
# a slow test launches), and each file's total. `--durations` gives wall times, which on 2 shared cores say more
# about what ran beside a test than about the test; the CPU is what the suite's time is made of.
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-report", type=int, default=0, metavar="N", help="show the N tests that cost most CPU")


_PHASE_STARTED = pytest.StashKey[float]()  # the CPU seconds at the start of a test's phase under way


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Each phase's CPU on its report (``user_properties`` travel from an xdist worker to the controller)."""
    outcome = yield
    if item.config.getoption("--cpu-report"):
        now, started = _cpu_seconds(), item.stash.get(_PHASE_STARTED, None)
        if started is not None:
            outcome.get_result().user_properties.append(("cpu_seconds", now - started))
        item.stash[_PHASE_STARTED] = now  # the next phase begins now


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if item.config.getoption("--cpu-report"):
        item.stash[_PHASE_STARTED] = _cpu_seconds()
    yield


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    count = config.getoption("--cpu-report")
    if not count:
        return
    by_test: Counter[str] = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()):
                if name == "cpu_seconds":
                    by_test[report.nodeid] += value
    by_file: Counter[str] = Counter()
    for nodeid, seconds in by_test.items():
        by_file[nodeid.split("::")[0]] += seconds
    write = terminalreporter.write_line
    terminalreporter.section(f"CPU seconds: {sum(by_test.values()):.0f} in all, the {count} costliest tests")
    for nodeid, seconds in by_test.most_common(count):
        write(f"{seconds:8.1f}  {nodeid}")
    terminalreporter.section("CPU seconds by file")
    for path, seconds in by_file.most_common():
        write(f"{seconds:8.1f}  {path}")
