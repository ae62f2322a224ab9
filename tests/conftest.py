from __future__ import annotations

import os
from collections import Counter

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


@pytest.hookimpl(trylast=True)  # after -m has deselected: the order is of the tests that run
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with the most slow (multi-process) tests first, then those with the most tests, each
    file's tests in their own order. ``make test`` runs the files on 2 workers (``pytest -n 2 --dist
    loadfile --no-loadscope-reorder``: pytest-xdist would otherwise hand them out by test count),
    in this order: the long files start first and the short ones fill in at the end, instead of a
    long file starting last while the other worker has nothing left to do."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    tests = Counter(item.path for item in items)
    items.sort(key=lambda item: (-slow[item.path], -tests[item.path]))  # stable: a file stays together, in order
