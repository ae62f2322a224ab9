"""``hooks`` holds every process-wide registry; the old homes still export their public names, and a plugin
acts only when ``plugins.install()`` calls its ``install()`` (importing it does nothing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stateful_sampler import hooks, loader, plugins, sampler


def test_the_public_names_of_the_old_homes_are_the_registrys() -> None:
    assert loader.add_batch_hook is hooks.add_batch_hook and loader.add_state_hook is hooks.add_state_hook
    assert sampler.add_pass_start_hook is hooks.add_pass_start_hook
    assert sampler.set_consumed_source is hooks.set_consumed_source
    assert plugins.add_trainer_observer is hooks.add_trainer_observer
    assert plugins.TrainerObserver is hooks.TrainerObserver
    assert plugins.load_plugins is plugins.install


def test_a_plugin_is_installed_once_by_install_not_by_its_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "seam_plugin_probe.py").write_text("CALLS = []\n\ndef install():\n    CALLS.append('install')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.PLUGINS_ENV, " seam_plugin_probe ,")
    monkeypatch.setattr(plugins, "_loaded", set())
    import seam_plugin_probe  # type: ignore[import-not-found]

    assert seam_plugin_probe.CALLS == []
    plugins.install()
    plugins.install()
    assert seam_plugin_probe.CALLS == ["install"]
    sys.modules.pop("seam_plugin_probe")


def test_an_observer_factory_is_offered_until_removed() -> None:
    class Observer:
        def batch(self, trainer: object, batch: object, batch_idx: int) -> None: ...
        def checkpoint(self, trainer: object) -> None: ...
        def train_end(self, trainer: object, module: object) -> None: ...
        def close(self) -> None: ...

    observer = Observer()
    remove = hooks.add_trainer_observer(lambda: observer)
    try:
        assert plugins.trainer_observers() == [observer]
    finally:
        remove()
    assert plugins.trainer_observers() == []
