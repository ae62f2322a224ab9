"""Every docstring Example in the package runs, so the first thing a reader copies cannot drift."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import stateful_sampler

MODULES = sorted(
    name
    for _, name, _ in pkgutil.walk_packages(stateful_sampler.__path__, "stateful_sampler.")
    if not name.endswith("__main__")  # running a __main__ module is its command, not an Example
)


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_of_each_module_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {name} failed (above)"


def test_the_examples_are_found() -> None:
    """A finder that found nothing would pass every module: the core's Examples are there."""
    sampler = importlib.import_module("stateful_sampler.sampler")
    tests = doctest.DocTestFinder().find(sampler)
    assert sum(len(test.examples) for test in tests) >= 5
