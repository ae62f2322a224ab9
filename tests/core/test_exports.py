"""The package's names are imported at their first use (``stateful_sampler.exports``): the command lines and
verify's guard process start without torch, and every exported name still resolves."""

from __future__ import annotations

import subprocess
import sys

import pytest

import stateful_sampler
import stateful_sampler.verify
from stateful_sampler.exports import lazy_exports


def imported_after(statement: str) -> set[str]:
    program = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


@pytest.mark.parametrize("module", ["stateful_sampler.cli", "stateful_sampler.verify.guard", "stateful_sampler"])
def test_a_command_line_or_the_guard_imports_no_torch(module: str) -> None:
    assert "torch" not in imported_after(f"import {module}")


def test_a_name_imports_its_module_then() -> None:
    assert "torch" in imported_after("from stateful_sampler import ResumableLoader")


@pytest.mark.parametrize("package", [stateful_sampler, stateful_sampler.verify], ids=lambda p: p.__name__)
def test_every_exported_name_resolves_and_is_listed(package: object) -> None:
    names = package.__all__  # type: ignore[attr-defined]
    assert all(getattr(package, name).__name__ == name for name in names)
    assert set(names) <= set(dir(package))


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="module 'stateful_sampler' has no attribute 'Sampler'"):
        stateful_sampler.Sampler  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError, match="Sampler"):
        from stateful_sampler import Sampler  # type: ignore[attr-defined]  # noqa: F401


def test_a_submodule_is_an_attribute_as_when_the_package_imported_it() -> None:
    program = "import stateful_sampler; print(stateful_sampler.errors.ShardReadError.__name__, stateful_sampler.order)"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("ShardReadError <module 'stateful_sampler.order'")


def test_a_star_import_gives_every_exported_name() -> None:
    namespace: dict[str, object] = {}
    exec("from stateful_sampler import *", namespace)  # noqa: S102
    assert set(stateful_sampler.__all__) <= set(namespace)


def test_a_resolved_name_is_kept_as_a_plain_attribute() -> None:
    from stateful_sampler.order.mixture import Mixture

    assert stateful_sampler.Mixture is Mixture and vars(stateful_sampler)["Mixture"] is Mixture


def test_a_name_of_a_module_not_exported_is_refused() -> None:
    getattr_, dir_ = lazy_exports("json", {"json.decoder": ("JSONDecoder",)})
    with pytest.raises(AttributeError, match="module 'json' has no attribute 'loads_fast'"):
        getattr_("loads_fast")
    assert "JSONDecoder" in dir_() and "dumps" in dir_()
