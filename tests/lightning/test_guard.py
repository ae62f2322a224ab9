"""The resume guard that the package's ``callbacks_factory`` entry point adds to every ``Trainer`` changes nobody
else's program (issue 25, item 8): it pickles (``ddp_spawn``), Lightning logs no line about it, and
``STATEFUL_SAMPLER_NO_LIGHTNING_GUARD=1`` leaves it out. Lightning's own ``ddp_spawn`` tests with it installed are
in tests/peers/test_lightning_spawn.py."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from stateful_sampler.lightning.guard import OPT_OUT_ENV, lightning_guard, pytorch_lightning_guard
from tests.lightning.lightning_harness import PACKAGE, Trainer, install_resume_guard

ROOT = Path(__file__).resolve().parents[2]
FACTORY = {"lightning": lightning_guard, "pytorch_lightning": pytorch_lightning_guard}[PACKAGE]
REGISTRY_LOGGER = {"lightning": "lightning.fabric", "pytorch_lightning": "lightning_fabric"}[PACKAGE]
REGISTRY_LOGGER += ".utilities.registry"


def guards(trainer: Trainer) -> list[str]:
    return [
        type(callback).__name__ for callback in trainer.callbacks if "stateful_sampler" in type(callback).__module__
    ]  # type: ignore[attr-defined]


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry point as pip installs it (a checkout that is not installed has none)."""
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    install_resume_guard(monkeypatch, tmp_path / "entry-points")


@pytest.mark.parametrize("factory", [lightning_guard, pytorch_lightning_guard], ids=["lightning", "pytorch_lightning"])
def test_the_guard_of_either_package_is_a_module_level_class_that_pickles(
    factory: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    [guard] = factory()  # type: ignore[operator]
    copy = pickle.loads(pickle.dumps(guard))
    assert type(copy) is type(guard)
    assert type(guard).__qualname__ == "StatefulSamplerResumeGuard"
    package = "lightning.pytorch" if factory is lightning_guard else "pytorch_lightning"
    assert any(base.__module__.startswith(package) and base.__name__ == "Callback" for base in type(guard).__mro__)


def test_every_trainer_gets_the_guard_and_lightning_logs_no_line_about_it(installed: None) -> None:
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(REGISTRY_LOGGER)
    logger.addHandler(handler)
    try:
        trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
        logger.info("Adding 1 callbacks from entry point 'other': OtherCallback")  # another package's line stays
    finally:
        logger.removeHandler(handler)
    assert set(guards(trainer)) == {"StatefulSamplerResumeGuard"}
    assert records == ["Adding 1 callbacks from entry point 'other': OtherCallback"]


def test_the_opt_out_variable_leaves_the_guard_out(installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPT_OUT_ENV, "1")
    assert FACTORY() == []
    assert guards(Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)) == []
    monkeypatch.setenv(OPT_OUT_ENV, "0")
    assert [type(guard).__name__ for guard in FACTORY()] == ["StatefulSamplerResumeGuard"]


def test_an_opt_out_value_other_than_0_or_1_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPT_OUT_ENV, "yes")
    with pytest.raises(ValueError, match=r"^STATEFUL_SAMPLER_NO_LIGHTNING_GUARD must be 1 \(no resume guard in "
                       r"Lightning Trainers\) or 0, got 'yes'$"):  # fmt: skip
        FACTORY()


@pytest.mark.slow
@pytest.mark.skipif(PACKAGE != "lightning", reason="the script is a lightning.pytorch user's")
def test_a_plain_ddp_spawn_fit_that_never_imports_the_package_passes_with_it_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25, item 8: the guard made by type(...) at call time failed every ddp_spawn fit with PicklingError.
    One script, two fits: guarded, then opted out (one launch of Lightning for both)."""
    install_resume_guard(monkeypatch, tmp_path / "entry-points")  # reaches the script through PYTHONPATH
    path = os.pathsep.join([str(tmp_path / "entry-points"), os.environ.get("PYTHONPATH", "")])
    environment = {**os.environ, "OMP_NUM_THREADS": "1", OPT_OUT_ENV: "", "PYTHONPATH": path}
    script = ROOT / "tests" / "lightning" / "plain_ddp_spawn_fit.py"
    finished = subprocess.run([sys.executable, str(script), str(tmp_path)], env=environment, capture_output=True,
                              text=True, timeout=600, check=False)  # fmt: skip
    output = finished.stdout + finished.stderr
    assert finished.returncode == 0, output[-4000:]
    for name, guarded in (("guarded", True), ("opted-out", False)):
        assert f"{name} finished: True" in finished.stdout.splitlines(), finished.stdout
        callbacks = next(line for line in finished.stdout.splitlines() if line.startswith(f"{name} callbacks: "))
        assert ("StatefulSamplerResumeGuard" in callbacks) == guarded, callbacks
    assert "from entry point" not in output
