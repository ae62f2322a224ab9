"""The stream-peers benchmark's ``--scratch`` shards (issue 27's 10^7 run writes them once, a later run on a quiet
machine reuses them): reused only where the marker written after the last shard matches, otherwise written anew
to the same bytes; and ``--full``'s systems, HF left out above 10^6 with the reason in the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import cases_stream_peers, stream_peers
from benchmarks.__main__ import markdown
from benchmarks.figures import Figures

RECORDS = 2_000


def _contents(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_shards_are_reused_only_where_the_marker_matches(tmp_path: Path) -> None:
    first = stream_peers.written("ours", tmp_path, RECORDS)
    assert (first["shards"], first["reused"]) == ("parquet", False)
    fresh = _contents(tmp_path / "parquet")
    assert len(fresh) == stream_peers.SHARDS
    marker = json.loads((tmp_path / "parquet.written.json").read_text())
    assert (marker["records"], marker["shards"], len(marker["files"])) == (RECORDS, 64, 64)

    assert stream_peers.written("ours", tmp_path, RECORDS) == {"shards": "parquet", "reused": True}

    (tmp_path / "parquet.written.json").unlink()  # a write killed before its marker
    (tmp_path / "parquet" / "part-063.parquet").unlink()
    assert stream_peers.written("ours", tmp_path, RECORDS)["reused"] is False
    assert _contents(tmp_path / "parquet") == fresh

    with open(tmp_path / "parquet" / "part-007.parquet", "r+b") as shard:  # a shard changed since its marker
        shard.truncate(100)
    assert stream_peers.written("ours", tmp_path, RECORDS)["reused"] is False
    assert _contents(tmp_path / "parquet") == fresh

    (tmp_path / "parquet" / "stray.parquet").write_bytes(b"")  # a file the marker does not name
    assert stream_peers.written("ours", tmp_path, RECORDS)["reused"] is False
    assert _contents(tmp_path / "parquet") == fresh

    assert stream_peers.written("ours", tmp_path, 2 * RECORDS)["reused"] is False  # another record count
    assert json.loads((tmp_path / "parquet.written.json").read_text())["records"] == 2 * RECORDS


def test_a_system_that_writes_no_shards_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="system must be one of .* to write shards, got 'hf'"):
        stream_peers.written("hf", tmp_path, RECORDS)


def test_the_full_run_leaves_hf_out_above_a_million_records_and_says_why() -> None:
    assert cases_stream_peers.full_systems(10**6, cases_stream_peers.FULL_SYSTEMS) == (
        ("ours", "ours-arrow", "litdata", "mosaic", "hf"),
        {},
    )
    systems, left_out = cases_stream_peers.full_systems(10**7, cases_stream_peers.FULL_SYSTEMS)
    assert systems == ("ours", "ours-arrow", "litdata", "mosaic")
    assert list(left_out) == ["hf"]
    table = markdown(Figures(rows=cases_stream_peers.rows({}, 10**7, (), False, left_out), checks=[]))
    assert f"| records/s, 0 workers | hf | — | — |  | {cases_stream_peers.HF_LEFT_OUT} |" in table


@pytest.mark.parametrize("flags", [["--full", "--no-epoch"], ["--full", "--resume-only"], ["--records", "511"]])
def test_flags_that_cannot_make_the_run_are_refused(flags: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        cases_stream_peers.main(flags)
    assert exited.value.code == 2
    assert "error: --" in capsys.readouterr().err
