"""``ShardManifest``: each shard's record count and content identity, read once and kept in a file, so that a
restart stats its shards instead of reading their footers (or, for a format without one, their records).

The order needs every shard's count before the first batch, and the state's digest needs every shard's
content identity (``stream.state``): read from the shards, that is a footer per shard (parquet), a pass over
the record batches (Arrow stream) or the whole shard (JSON Lines) before anything is delivered. The manifest
keeps both, keyed by what the storage says of each shard's bytes without reading them (size and modification
time, an ETag: ``remote.stored_identity``): a shard whose bytes changed has another key and is read again, so
a changed shard is still refused at ``load_state_dict``, naming it. It is the trust the node cache's manifest
and the tar index already take (``ShardCache``, ``TarReader``). A reader's own settings (``version``,
``checksums``) are joined to what the manifest keeps in each process, so a changed setting changes the identity.

The file is a cache: one missing, unreadable or of another reader is read again from the shards and written
anew (atomically; processes building at once each write a whole file); one that cannot be written is warned
about (``RuntimeWarning``), and the stream goes on with what it read. Whoever may write it decides the
counts a run trusts: keep it where only the jobs' own user writes.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateful_sampler.stream.readers import ShardMetadata, identity_in_two_steps
from stateful_sampler.stream.remote import StoredIdentity, stored_identity

_VERSION = 1


@dataclass(frozen=True)
class Known:
    """What the manifest gives a stream: each shard's count, and its identity (None: a reader without one)."""

    counts: list[int]
    identities: list[str] | None


class ShardManifest:
    """The file at ``path`` of what ``reader`` read of each shard, by the shard's stored identity.

    Example:
        >>> import tempfile, pathlib
        >>> from stateful_sampler.stream import JsonlReader
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (folder / "a.jsonl").write_text('{"x": 1}\\n{"x": 2}\\n')
        >>> known = ShardManifest(folder / "manifest.json").look_up(JsonlReader(), [str(folder / "a.jsonl")])
        >>> known.counts, (folder / "manifest.json").exists()
        ([2], True)
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def look_up(self, reader: Any, shards: Sequence[str]) -> Known:
        """Each shard's count and identity: from the file where the shard's stored identity is the one kept,
        else read from the shard (and the file written again with it)."""
        kind = f"{type(reader).__module__}.{type(reader).__qualname__}"
        kept = self._read(kind)
        storage_options = getattr(reader, "storage_options", None)
        two_steps = identity_in_two_steps(reader)
        identify = getattr(reader, "identity", None)
        counts, identities, changed = [], [], False
        for shard in shards:
            entry = kept.get(shard)
            stored = stored_identity(shard, storage_options)
            if entry is None or entry["stored"] != [stored.size, stored.version]:
                entry, changed = _read_entry(reader, shard, stored, two_steps), True
                kept[shard] = entry
            counts.append(int(entry["count"]))
            if identify is None:
                continue
            if two_steps:
                metadata = ShardMetadata(StoredIdentity(*entry["stored"]), entry["content"], entry["count"])
                identities.append(reader.identity_from(shard, metadata))
            else:  # a reader's own identity, asked as the stream would ask it
                identities.append(identify(shard))
        if changed:
            try:
                self._write(kind, kept)
            except OSError as error:  # a cache: this start read the shards, so its counts and identities hold
                warnings.warn(
                    f"shard_manifest: could not write {str(self.path)!r} ({error}); this start read its shards, "
                    "and every start will until the file can be written",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return Known(counts, None if identify is None else identities)

    def _read(self, kind: str) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("version") != _VERSION or data.get("reader") != kind:
            return {}
        shards = data.get("shards")
        if not isinstance(shards, dict):
            return {}
        return {name: entry for name, entry in shards.items() if _well_formed(entry)}

    def _write(self, kind: str, shards: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"version": _VERSION, "reader": kind, "shards": shards}, sort_keys=True)
        handle, partial = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".partial")
        try:
            with os.fdopen(handle, "w") as file:
                file.write(text)
            os.replace(partial, self.path)
        except BaseException:
            os.unlink(partial)
            raise


def _read_entry(reader: Any, shard: str, stored: StoredIdentity, two_steps: bool) -> dict[str, Any]:
    """What the manifest keeps of one shard, read from it: its count and, for a reader whose identity comes
    in two steps, the format's content identity, keyed by the stored identity of the bytes read."""
    if not two_steps:
        return {"stored": [stored.size, stored.version], "count": int(reader.count(shard)), "content": None}
    metadata = reader.metadata(shard)
    count = metadata.count if metadata.count is not None else reader.count(shard)
    stored = metadata.stored
    return {"stored": [stored.size, stored.version], "count": int(count), "content": metadata.content}


def _well_formed(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("stored"), list) or len(entry["stored"]) != 2:
        return False
    size, version = entry["stored"]
    count, content = entry.get("count"), entry.get("content")
    return (
        (size is None or type(size) is int)
        and isinstance(version, str)
        and type(count) is int
        and count >= 0
        and (content is None or isinstance(content, str))
    )
