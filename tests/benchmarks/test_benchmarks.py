"""The benchmark runner (issue 25, item 25): each figure's tables are printed as soon as it is measured,
a figure that fails is reported without losing the others and the run exits 1, and the stream figure
runs on a clean checkout (its shard names are no files). CI runs every figure at a tiny size with
``python -m benchmarks --smoke`` (.ci/run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import benchmarks.__main__ as runner
from benchmarks import cases_stream
from benchmarks.figures import Check, Figures, Mode, Row


def test_a_failing_figure_is_reported_and_the_figures_around_it_are_kept(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    printed_before: list[str] = []

    def first(mode: Mode, run: object, figures: Figures) -> None:
        figures.rows.append(Row("first figure", "case a", "ours", 1.0, "s"))
        figures.checks.append(Check("first ≤ 2 s", "1 s", True))

    def broken(mode: Mode, run: object, figures: Figures) -> None:
        printed_before.append(capsys.readouterr().out)  # what reached stdout before this figure ran
        figures.rows.append(Row("broken figure", "case b", "ours", 3.0, "s"))
        raise RuntimeError("case shard_io({'size': 4}) failed:\nTraceback ...")

    def last(mode: Mode, run: object, figures: Figures) -> None:
        figures.rows.append(Row("last figure", "case c", "ours", 5.0, "s"))

    monkeypatch.setattr(runner, "FIGURES", {"first": first, "broken": broken, "last": last})
    report = tmp_path / "bench.json"
    assert runner.main(["--smoke", "--json", str(report)]) == 1
    out = printed_before[0] + capsys.readouterr().out
    assert "### first figure" in printed_before[0] and "| case a | ours | 1 s |" in printed_before[0]
    assert out.index("## first (") < out.index("## broken (") < out.index("## last (")
    assert "| case b | ours | 3 s |" in out  # measured before the failure: kept
    assert (
        "\n**FAILED**: RuntimeError: case shard_io({'size': 4}) failed: (the 1 row(s) above were measured before "
        "it; the traceback is on stderr)\n"
    ) in out
    assert "| case c | ours | 5 s |" in out
    assert out.endswith("\n### failed figures\n\n- broken: RuntimeError: case shard_io({'size': 4}) failed:\n")
    assert "| first ≤ 2 s | 1 s | not judged (smoke) |" in out
    saved = json.loads(report.read_text())
    assert saved["failed"] == {"broken": "RuntimeError: case shard_io({'size': 4}) failed:"}
    assert [row["case"] for row in saved["rows"]] == ["case a", "case b", "case c"]


def test_a_run_without_failures_exits_0_and_judges_its_targets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def measured(mode: Mode, run: object, figures: Figures) -> None:
        assert mode == Mode("quick")
        figures.checks.append(Check("fast enough", "1 s", False))

    monkeypatch.setattr(runner, "FIGURES", {"measured": measured})
    assert runner.main(["--quick"]) == 0  # a missed target is a measurement, not a failure
    assert "| fast enough | 1 s | **MISSED** |" in capsys.readouterr().out


def test_the_modes_pick_their_sizes_and_refuse_another_name() -> None:
    assert [Mode(name).pick(quick=2, smoke=1, full=3) for name in ("smoke", "quick", "full")] == [1, 2, 3]
    assert Mode("full").pick(quick=2, smoke=1) == 2
    with pytest.raises(ValueError, match=r"^mode must be one of \['smoke', 'quick', 'full'\], got 'fast'$"):
        Mode("fast")


def test_the_stream_figures_order_shards_that_are_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # make bench on a clean checkout: the names 's0', 's1', ... are no files, and must not be looked up.
    monkeypatch.chdir(tmp_path)
    quality = cases_stream.stream_quality([4], epochs=1)
    assert [row["window"] for row in quality["rows"]] == [4]
    assert 0 <= quality["rows"][0]["window_shuffle"]["first_tv"] <= 1
    resume = cases_stream.stream_resume(10**5, 10, 2)
    assert resume["state_json_bytes"] <= 512
