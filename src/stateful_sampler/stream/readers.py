"""Shard readers: the small protocol the stream reads through, and parquet via pyarrow.

A reader answers two questions: how many records a shard holds (asked once per shard, when the
stream is built) and which records lie in rows [start, stop) of a shard. The stream asks the
second once per shard per window and reader, for the span of rows that reader needs there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from stateful_sampler.errors import ShardReadError


@runtime_checkable
class ShardReader(Protocol):
    def count(self, shard: str) -> int:
        """The records in ``shard``, from metadata where the format has it."""
        ...

    def read(self, shard: str, start: int, stop: int) -> Sequence[Any]:
        """Records ``start .. stop - 1`` of ``shard``, in row order."""
        ...


@dataclass
class ReadStats:
    """What one reader process read: shards opened, rows and bytes (compressed, from metadata)."""

    opened: int = 0
    rows: int = 0
    bytes: int = 0


@dataclass
class ParquetReader:
    """Parquet shards through pyarrow: counts from the footer, reads by whole row groups.

    Records are dicts of column values (``pyarrow.Table.to_pylist``); ``columns`` selects some.
    """

    columns: list[str] | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    def count(self, shard: str) -> int:
        parquet = _open(shard)
        parquet.close()
        return parquet.metadata.num_rows

    def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
        parquet = _open(shard)
        self.stats.opened += 1
        metadata = parquet.metadata
        groups, first_row, row = [], None, 0
        for index in range(metadata.num_row_groups):
            group = metadata.row_group(index)
            if row < stop and row + group.num_rows > start:
                groups.append(index)
                first_row = row if first_row is None else first_row
                self.stats.rows += group.num_rows
                self.stats.bytes += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
            row += group.num_rows
        try:
            table = parquet.read_row_groups(groups, columns=self.columns)
        except Exception as error:  # pyarrow raises OSError or ArrowInvalid for a corrupt file
            raise ShardReadError(f"could not read rows {start}..{stop - 1} of shard {shard!r}: {error}") from error
        finally:
            parquet.close()
        return table.slice(start - (first_row or 0), stop - start).to_pylist()


def _open(shard: str) -> Any:
    import pyarrow.parquet as pq  # the `stream` extra: importing the stream does not need it

    try:
        return pq.ParquetFile(shard)
    except Exception as error:  # FileNotFoundError, or ArrowInvalid for a file that is not parquet
        raise ShardReadError(f"could not open shard {shard!r}: {error}") from error
