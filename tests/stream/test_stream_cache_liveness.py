"""ShardCache's liveness test is a lock held by the living, not a process id: it holds across PID namespaces
(two containers sharing the node's cache directory), where another namespace's ids mean nothing here."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stateful_sampler.stream import ParquetReader, ShardCache
from tests.stream.test_stream_cache import cached, fetched, shards

UNKNOWABLE = 2**22 + 12345  # above this machine's pid_max: no process here has it, as for another namespace's


def held(path: Path) -> object:
    """``path`` created and locked as a live process of another PID namespace holds its download or pin."""
    handle = open(path, "wb")  # noqa: SIM115 - held open past this function, as the live process holds it
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def test_a_live_download_of_a_process_whose_pid_means_nothing_here_is_kept(tmp_path: Path) -> None:
    paths = shards(tmp_path, 2)
    directory = tmp_path / "cache"
    cache = ShardCache(ParquetReader(), directory, max_bytes=1 << 20, prefetch=False)
    key = cache._key(paths[0])[0]
    live = held(directory / f"{key}.part-{UNKNOWABLE}-0")  # another namespace's live download, old-style name
    cache.fetch(paths[1])  # a reservation: parts of dead processes are removed
    assert (directory / f"{key}.part-{UNKNOWABLE}-0").exists()
    live.close()  # its process died: the kernel releases the lock
    cache.fetch(paths[0])
    assert not list(directory.glob("*.part-*"))


def test_a_download_nobody_holds_is_removed_even_under_a_live_pid(tmp_path: Path) -> None:
    paths = shards(tmp_path, 2)
    directory = tmp_path / "cache"
    cache = ShardCache(ParquetReader(), directory, max_bytes=1 << 20, prefetch=False)
    key = cache._key(paths[0])[0]
    # A part left by a dead process whose pid now belongs to a live one (here: this test's process, or pid 1).
    for pid in (os.getpid(), 1):
        (directory / f"{key}.part-{pid}-0").write_bytes(b"\0" * 100)
    cache.fetch(paths[1])
    assert not list(directory.glob("*.part-*"))


def test_a_live_readers_pin_of_another_namespace_is_kept_and_its_shards_not_evicted(tmp_path: Path) -> None:
    paths = shards(tmp_path, 4)
    size = max(os.path.getsize(path) for path in paths)
    directory = tmp_path / "cache"
    cache = ShardCache(ParquetReader(), directory, max_bytes=2 * size, prefetch=False)
    keys = [cache.fetch(path).stem for path in paths[:2]]
    pin = directory / "pins" / f"{UNKNOWABLE}-0"
    live = held(pin.with_suffix(".lock"))
    pin.with_suffix(".json").write_text(json.dumps(keys))
    (directory / "pins" / f"{os.getpid()}-9.json").write_text(json.dumps(keys))  # a dead reader's, live pid
    cache.fetch(paths[2])  # no room: only done shards may go, and both are pinned by the live reader
    assert pin.with_suffix(".json").exists() and not (directory / "pins" / f"{os.getpid()}-9.json").exists()
    assert cached(directory) == 3
    live.close()  # the reader died
    cache.fetch(paths[3])
    assert not pin.with_suffix(".json").exists() and cached(directory) == 2


_DOWNLOAD = """
import os, sys, time
from pathlib import Path
from stateful_sampler.stream import ParquetReader, ShardCache, remote

shard, directory, release = sys.argv[1:4]
opened = remote.open_shard

class Held:
    # The origin's file, whose first read waits until the test says go: the download is in flight.
    def __init__(self, file):
        self.file = file
    def read(self, size=-1):
        while not os.path.exists(release):
            time.sleep(0.01)
        return self.file.read(size)
    def __getattr__(self, name):
        return getattr(self.file, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.file.close()

remote.open_shard = lambda *args: Held(opened(*args))
copy = ShardCache(ParquetReader(), directory, max_bytes=1 << 20, prefetch=False).fetch(shard)
print(ParquetReader().read(str(copy), 0, 20))
sys.stdout.flush()
os._exit(0)  # no interpreter teardown: a native thread pool sometimes aborts there (exit -6), after the result
"""

_RESERVE = """
import os, sys
from stateful_sampler.stream import ParquetReader, ShardCache
ShardCache(ParquetReader(), sys.argv[2], max_bytes=1 << 20, prefetch=False).fetch(sys.argv[1])
print(os.getpid())
"""


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=30,
                              check=False).returncode == 0  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare --pid --fork` (root, or user namespaces)")
def test_a_process_in_another_pid_namespace_never_deletes_a_live_download(tmp_path: Path) -> None:
    paths = shards(tmp_path, 2)
    directory, release = tmp_path / "cache", tmp_path / "release"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    downloading = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_DOWNLOAD), paths[0], str(directory), str(release)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
    )  # fmt: skip
    try:
        while not list(directory.glob("*.part-*")):  # the reservation made, the download held at its first read
            assert downloading.poll() is None, downloading.communicate()
            time.sleep(0.01)
        # Another container: its own PID namespace, where the downloader's pid does not exist.
        other = subprocess.run(
            ["unshare", "--pid", "--fork", sys.executable, "-c", _RESERVE, paths[1], str(directory)],
            capture_output=True, text=True, env=environment, timeout=120, check=False,
        )  # fmt: skip
        assert other.returncode == 0, other.stderr
        assert other.stdout.split()[-1] == "1"  # it ran as pid 1 of its own namespace
        assert list(directory.glob("*.part-*"))  # the live download is still there
        release.touch()
        out, err = downloading.communicate(timeout=120)
    finally:
        release.touch()
        downloading.wait(timeout=120)
    assert downloading.returncode == 0, err
    assert out.strip() == str([{"x": x} for x in range(20)])
    assert sorted(fetched(directory)) == sorted(paths)
