"""The shards each format reader is tested on: written here (tar, Arrow) or copied from tests/fixtures (written by
the formats' own writers: MDS, LitData, a saved HF dataset), and how to open them. Shared by the reader contract
test and the kill harness (tests/stream/stream_kill_run.py ``--reader``), which runs in its own process.

Every record carries an id, unique in its dataset (``record_id``), so a test can say which record arrived."""

from __future__ import annotations

import io
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyarrow import feather

from stateful_sampler.stream import (
    ArrowReader,
    LitDataReader,
    MDSReader,
    ShardReader,
    TarReader,
    saved_dataset_shards,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
COUNTS = [7, 5, 9, 5]  # the shards written here: 26 records, as in each fixture


def tar_shards(root: Path) -> None:
    for shard, count in enumerate(COUNTS):
        with tarfile.open(root / f"train-{shard:03d}.tar", "w") as archive:
            for row in range(count):
                ident = 100 * shard + row
                files = {"cls": str(ident).encode(), "txt": f"record {ident}".encode(), "jpg": bytes([row]) * row}
                for suffix, data in files.items():
                    info = tarfile.TarInfo(f"{ident:06d}.{suffix}")
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))


def arrow_shards(root: Path) -> None:
    """A stream file, a file-format file, a Feather v2 file and a stream of one-row batches."""
    for shard, count in enumerate(COUNTS):
        ids = [100 * shard + row for row in range(count)]
        table = pa.table(
            {"id": ids, "text": [f"record {ident}" for ident in ids], "vector": [[ident] * 3 for ident in ids]}
        )
        path = root / f"part-{shard:03d}.arrow"
        if shard == 1:
            with pa.ipc.new_file(path, table.schema) as writer:
                writer.write_table(table, max_chunksize=2)
        elif shard == 2:
            feather.write_feather(table, path, chunksize=4)
        else:
            with pa.ipc.new_stream(path, table.schema) as writer:
                writer.write_table(table, max_chunksize=3 if shard == 0 else 1)


def copy_fixture(name: str) -> Callable[[Path], None]:
    def copy(root: Path) -> None:
        shutil.copytree(FIXTURES / name, root, dirs_exist_ok=True)

    return copy


def in_directory(suffix: str, reader: Callable[[], ShardReader]) -> Callable[[Path], tuple[list[str], ShardReader]]:
    return lambda root: (sorted(str(path) for path in root.glob(f"*{suffix}")), reader())


@dataclass(frozen=True)
class Format:
    """How a format's test shards are made in a directory, opened, and how a record says its id."""

    write: Callable[[Path], None]
    open: Callable[[Path], tuple[list[str], ShardReader]]
    record_id: Callable[[Any], int]


def _index_reader(kind: type) -> Callable[[Path], tuple[list[str], ShardReader]]:
    def open_(root: Path) -> tuple[list[str], ShardReader]:
        reader = kind(str(root))
        return list(reader.shards), reader

    return open_


def _saved(root: Path) -> tuple[list[str], ShardReader]:
    return saved_dataset_shards(str(root)), ArrowReader()


FORMATS: dict[str, Format] = {
    "tar": Format(tar_shards, in_directory(".tar", TarReader), lambda record: int(record["cls"])),
    "arrow": Format(arrow_shards, in_directory(".arrow", ArrowReader), lambda record: record["id"]),
    "hf-saved": Format(copy_fixture("hf-saved"), _saved, lambda record: record["id"]),
    "mds": Format(copy_fixture("mds"), _index_reader(MDSReader), lambda record: record["id"]),
    "litdata": Format(copy_fixture("litdata"), _index_reader(LitDataReader), lambda record: record["id"]),
    "litdata-tuples": Format(copy_fixture("litdata-tuples"), _index_reader(LitDataReader), lambda record: record[0]),
}


class IdAugment:
    """The kill harness's seeded augmentation of a format's record: (its id, a random number), picklable."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, record: Any, rng: Any) -> Any:
        import torch

        ident = FORMATS[self.name].record_id(record)
        return torch.tensor([float(ident), float(torch.rand(1, generator=rng.torch))], dtype=torch.float64)
