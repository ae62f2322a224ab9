"""Each format reader against the format's own reader, and what is particular to it: the tar index (built once,
where it is kept, rebuilt when the shard changes), what each reader refuses and how it says so.

tests/fixtures/*/expected.json holds the records as the writers' own readers return them (Mosaic's MDSReader,
litdata's StreamingDataset, webdataset's tar iterator, datasets.load_from_disk); tests/fixtures/make_format_fixtures.py
made them."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stateful_sampler.stream import (
    ArrowReader,
    LitDataReader,
    MDSReader,
    ShardCache,
    ShardReadError,
    TarReader,
    saved_dataset_shards,
)
from stateful_sampler.stream import tar as tar_module
from tests.stream_readers import FIXTURES, tar_shards

sys.path.insert(0, str(FIXTURES))
from make_format_fixtures import canonical

sys.path.remove(str(FIXTURES))


def expected(name: str) -> list[Any]:
    return json.loads((FIXTURES / name / "expected.json").read_text())


def read_all(reader: Any, shards: list[str]) -> list[Any]:
    return [canonical(record) for shard in shards for record in reader.read(shard, 0, reader.count(shard))]


@pytest.mark.parametrize("name", ["mds", "litdata", "litdata-tuples"])
def test_mds_and_litdata_records_are_the_writers_own_readers_records(name: str) -> None:
    reader = (MDSReader if name == "mds" else LitDataReader)(str(FIXTURES / name))
    assert read_all(reader, reader.shards) == expected(name)


def test_a_saved_hf_dataset_reads_as_load_from_disk_reads_it() -> None:
    shards = saved_dataset_shards(str(FIXTURES / "hf-saved"))
    assert [Path(shard).name for shard in shards] == [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    assert read_all(ArrowReader(), shards) == expected("hf-saved")


def test_a_dataset_dict_directory_is_refused_naming_a_split(tmp_path: Path) -> None:
    (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(ValueError, match=r"holds a DatasetDict \(splits \['train', 'test'\]\): pass one split's dir"):
        saved_dataset_shards(str(tmp_path))
    with pytest.raises(ShardReadError, match=r"has no state.json: it is not a datasets.Dataset.save_to_disk dir"):
        saved_dataset_shards(str(tmp_path / "train"))


def test_tar_records_are_grouped_exactly_as_webdataset_groups_them(tmp_path: Path) -> None:
    """Keys up to the first dot of the file name, suffixes lower-cased, a key seen again later a new record,
    files without a dot, directories and __meta__ skipped, __x__ below the top kept (webdataset's regexp)."""
    shard = shutil.copy(FIXTURES / "tar" / "tricky.tar", tmp_path / "tricky.tar")
    records = TarReader().read(str(shard), 0, 7)
    assert [canonical({**record, "__url__": "tricky.tar"}) for record in records] == expected("tar")


def test_a_tar_index_is_built_once_beside_the_shard_and_a_span_is_read_by_seeking(tmp_path: Path, monkeypatch) -> None:
    tar_shards(tmp_path)
    shard = str(tmp_path / "train-002.tar")
    assert TarReader().count(shard) == 9
    assert (tmp_path / "train-002.tar.tarindex").exists()
    monkeypatch.setattr(tar_module, "scan_tar", lambda *args: pytest.fail("scanned although the index fits"))
    reader = TarReader()
    span = reader.read_span(shard, 4, 7)
    assert (reader.count(shard), reader.stats.converted) == (9, 0)  # nothing built before a record is taken
    assert span.records_at([2, 0]) == [
        {"__key__": "000206", "__url__": shard, "cls": b"206", "txt": b"record 206", "jpg": b"\x06" * 6},
        {"__key__": "000204", "__url__": shard, "cls": b"204", "txt": b"record 204", "jpg": b"\x04" * 4},
    ]
    assert (reader.stats.converted, reader.stats.rows) == (2, 3)
    os.utime(shard)  # a ShardCache touches its copies: same bytes, another mtime; the index still fits
    assert TarReader().count(shard) == 9


def test_a_tar_shard_rewritten_gets_a_new_index_and_a_new_identity(tmp_path: Path) -> None:
    tar_shards(tmp_path)
    shard = str(tmp_path / "train-001.tar")
    before = TarReader().identity(shard)
    shutil.copy(tmp_path / "train-002.tar", shard)  # another tar under the same name
    reader = TarReader()
    assert reader.count(shard) == 9 and reader.identity(shard) != before
    assert reader.read(shard, 8, 9)[0]["cls"] == b"208"


def test_a_tar_index_goes_to_the_user_cache_when_it_cannot_be_written_beside_the_shard(
    tmp_path: Path, monkeypatch
) -> None:
    tar_shards(tmp_path)
    (tmp_path / "train-000.tar.tarindex").mkdir()  # what a read-only directory does to the write: an OSError
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert TarReader().count(str(tmp_path / "train-000.tar")) == 7
    assert len(list((tmp_path / "xdg" / "stateful-sampler" / "tar-index").glob("*.tarindex"))) == 1
    monkeypatch.setattr(tar_module, "scan_tar", lambda *args: pytest.fail("scanned although the index fits"))
    assert TarReader().count(str(tmp_path / "train-000.tar")) == 7  # found there by the next reader


def test_a_tar_read_through_a_shard_cache_keeps_its_index_beside_the_copy_outside_the_cache_size(
    tmp_path: Path, monkeypatch
) -> None:
    (tmp_path / "origin").mkdir()
    tar_shards(tmp_path / "origin")
    url = (tmp_path / "origin" / "train-000.tar").as_uri()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = ShardCache(TarReader(), tmp_path / "cache", max_bytes=1 << 20)
    assert cache.count(url) == 7  # counted on the node's copy, fetched for it: the index is beside the copy
    assert not list((tmp_path / "xdg").rglob("*.tarindex")) and not list((tmp_path / "origin").glob("*.tarindex"))
    assert [record["cls"] for record in cache.read(url, 5, 7)] == [b"5", b"6"]
    assert cache.stats().transfers == 1  # the read took the copy the count fetched
    copies = [path.name for path in (tmp_path / "cache").iterdir() if path.suffix in (".shard", ".tarindex")]
    assert sorted(name.split(".")[1] for name in copies) == ["shard", "tarindex"]
    assert all(".shard" not in name for name in copies if name.endswith(".tarindex"))  # not counted as a shard


def test_index_paths_are_beside_a_local_shard_and_in_index_dir_for_a_url(tmp_path: Path) -> None:
    reader = TarReader(index_dir=tmp_path / "idx")
    assert reader.index_paths("s3://bucket/a.tar")[0].parent == tmp_path / "idx"
    assert TarReader().index_paths(str(tmp_path / "a.tar"))[0] == tmp_path / "a.tar.tarindex"
    assert TarReader().index_paths(str(tmp_path / "0f3a.shard"))[0] == tmp_path / "0f3a.tarindex"


def test_a_gzipped_tar_is_refused_saying_why(tmp_path: Path) -> None:
    tar_shards(tmp_path)
    zipped = tmp_path / "a.tar.gz"
    zipped.write_bytes(gzip.compress((tmp_path / "train-000.tar").read_bytes()))
    with pytest.raises(ShardReadError, match=r"a.tar.gz' is a gzip-compressed tar: TarReader reads uncompressed"):
        TarReader().count(str(zipped))


def test_an_arrow_span_reads_only_the_record_batches_its_rows_lie_in(tmp_path: Path) -> None:
    import pyarrow as pa

    table = pa.table({"x": list(range(100))})
    for kind, new in [("stream", pa.ipc.new_stream), ("file", pa.ipc.new_file)]:
        path = tmp_path / f"{kind}.arrow"
        with new(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=10)
        reader = ArrowReader()
        span = reader.read_span(str(path), 35, 52)
        assert (len(span), reader.stats.rows, reader.stats.converted) == (17, 30, 0)  # batches 30..59
        assert span.records_at(np.array([16, 0])) == [{"x": 51}, {"x": 35}]


def test_mds_pickle_columns_are_refused_unless_the_user_opts_in(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "mds", tmp_path, dirs_exist_ok=True)
    index = json.loads((tmp_path / "index.json").read_text())
    for shard in index["shards"]:
        shard["column_encodings"][shard["column_names"].index("meta")] = "pkl"
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"column 'meta' is encoded 'pkl': unpickling runs code from the shard; "
                                         r"pass MDSReader\(..., allow_unsafe_types=True\)"):  # fmt: skip
        MDSReader(str(tmp_path))
    MDSReader(str(tmp_path), allow_unsafe_types=True)  # builds; the bytes are JSON, not a pickle, so no read here


def test_a_zstd_mds_shard_reads_with_a_decompressor_or_is_refused_saying_what_to_install() -> None:
    reader = MDSReader(str(FIXTURES / "mds-zstd"))
    try:
        import zstandard  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(ShardReadError, match=r"shard.00000.mds.zstd' is zstd-compressed and no zstd decompressor is "
                                                 r"installed: pip install zstandard"):  # fmt: skip
            reader.read(reader.shards[0], 0, 1)
        return
    assert [record["id"] for record in reader.read(reader.shards[0], 0, 4)] == [0, 1, 2, 3]  # pragma: no cover


def test_litdata_compressed_or_encrypted_chunks_are_refused_naming_the_option(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "litdata", tmp_path, dirs_exist_ok=True)
    index = json.loads((tmp_path / "index.json").read_text())
    index["config"]["compression"] = "zstd"
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ShardReadError, match=r"the chunks use compression 'zstd', which LitDataReader does not read"):
        LitDataReader(str(tmp_path))


def test_litdata_pickle_leaves_are_refused_unless_the_user_opts_in(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "litdata-tuples", tmp_path, dirs_exist_ok=True)
    index = json.loads((tmp_path / "index.json").read_text())
    index["config"]["data_format"][1] = "pickle"
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"a leaf is serialized 'pickle': unpickling runs code from the chunk; "
                                         r"pass LitDataReader\(..., allow_pickle=True\)"):  # fmt: skip
        LitDataReader(str(tmp_path))


@pytest.mark.parametrize("kind", [MDSReader, LitDataReader])
def test_a_renamed_copy_of_a_shard_reads_its_count_from_the_shard_itself(kind: type, tmp_path: Path) -> None:
    """What a ShardCache hands the reader: ``<key>.shard``, which the index does not name."""
    name = "mds" if kind is MDSReader else "litdata"
    reader = kind(str(FIXTURES / name))
    copy = shutil.copy(reader.shards[1], tmp_path / "0a1b.shard")
    assert reader.count(str(copy)) == reader.count(reader.shards[1])
    assert read_all(reader, [str(copy)]) == read_all(reader, [reader.shards[1]])


def test_a_tar_with_a_corrupt_header_in_the_middle_is_refused_not_read_short(tmp_path: Path) -> None:
    """tarfile ends the archive quietly at a bad header past the first (webdataset then yields fewer records)."""
    tar_shards(tmp_path)
    shard = tmp_path / "train-002.tar"
    data = bytearray(shard.read_bytes())
    middle = data.index(b"000204.cls")  # a member header's name field
    data[middle : middle + 10] = b"\xff" * 10
    shard.write_bytes(bytes(data))
    with pytest.raises(
        ShardReadError,
        match=r"train-002.tar' is truncated or corrupt at byte 11776 of 30720: a member header "
        r"or the end-of-archive block should be there, after 12 members",
    ):
        TarReader().count(str(shard))


def _count_in_a_process(shard: str) -> int:
    return TarReader().count(shard)


def test_concurrent_processes_building_one_tar_index_all_read_it_and_leave_one_whole_index(tmp_path: Path) -> None:
    import multiprocessing

    tar_shards(tmp_path)
    shard = str(tmp_path / "train-002.tar")
    pool = multiprocessing.get_context("fork").Pool(4)
    try:
        assert pool.map(_count_in_a_process, [shard] * 8) == [9] * 8
    finally:  # the workers end on the pool's sentinel: `with` would SIGTERM them, which a handler may catch
        pool.close()
        pool.join()
    left = sorted(path.name for path in tmp_path.iterdir() if "train-002" in path.name)
    assert left == ["train-002.tar", "train-002.tar.tarindex"]  # no temporary file left behind
    header, body = map(json.loads, (tmp_path / "train-002.tar.tarindex").read_text().splitlines())
    assert (header["records"], body["keys"][-1]) == (9, "000208")


def test_long_member_names_in_pax_and_gnu_headers_are_read_at_their_data(tmp_path: Path) -> None:
    key = "deep/" * 30 + "sample"  # 156 characters: an extended header before the member's own
    for form in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        shard = tmp_path / f"{form}.tar"
        with tarfile.open(shard, "w", format=form) as archive:
            for suffix, data in [("jpg", b"J" * 700), ("cls", b"7")]:
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        assert TarReader().read(str(shard), 0, 1) == [
            {"__key__": key, "__url__": str(shard), "jpg": b"J" * 700, "cls": b"7"}
        ]


def test_count_and_identity_of_an_indexed_tar_read_the_index_header_only(tmp_path: Path, monkeypatch) -> None:
    """A stream built (or resumed) on many indexed shards asks each for its count and identity: the index's
    first line answers both, and the per-record body is parsed only when a span of the shard is read."""
    tar_shards(tmp_path)
    shard = str(tmp_path / "train-002.tar")
    identity = TarReader().identity(shard)
    index_file = tmp_path / "train-002.tar.tarindex"
    header = index_file.read_text().splitlines()[0]
    index_file.write_text(f"{header}\nnot the body\n")

    def scan(*args: Any) -> None:
        raise RuntimeError("scanned")

    monkeypatch.setattr(tar_module, "scan_tar", scan)
    reader = TarReader()
    assert (reader.count(shard), reader.identity(shard)) == (9, identity)  # no scan, no body
    with pytest.raises(RuntimeError, match="scanned"):  # a span needs the body: unreadable, so the shard is scanned
        reader.read(shard, 0, 1)


def test_an_arrow_stream_cut_at_a_batch_boundary_is_refused_not_read_short(tmp_path: Path) -> None:
    """What a writer killed mid-write leaves: whole batches and no end-of-stream marker. pyarrow reads the
    batches there are; the reader refuses it instead of counting fewer rows."""
    import pyarrow as pa

    table = pa.table({"x": list(range(10))})
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, table.schema)
    writer.write_table(table, max_chunksize=3)
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(sink.getvalue().to_pybytes())  # before close: no end-of-stream marker
    with pytest.raises(ShardReadError, match=r"cut.arrow' ends after 10 rows without its end-of-stream marker"):
        ArrowReader().count(str(cut))


def test_a_half_written_tar_index_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    tar_shards(tmp_path)
    shard = str(tmp_path / "train-002.tar")
    expected_records = TarReader().read(shard, 0, 9)
    index_file = tmp_path / "train-002.tar.tarindex"
    text = index_file.read_text()
    for cut in (len(text) // 3, len(text) - 20):  # in the header line, in the body line
        index_file.write_text(text[:cut])
        reader = TarReader()
        assert (reader.count(shard), reader.read(shard, 0, 9)) == (9, expected_records)
        assert index_file.read_text() == text  # written again, whole
