"""A real S3-compatible server on 127.0.0.1 (moto in server mode, its own process) for the remote
stream tests, the example's test and the benchmarks: a free port, started, answering, stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.helpers import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    @property
    def storage_options(self) -> dict[str, Any]:
        """What fsspec (s3fs) needs to reach this server."""
        return {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}

    @property
    def environment(self) -> dict[str, str]:
        """The same for a subprocess: botocore reads ``AWS_ENDPOINT_URL``."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def filesystem(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(**self.storage_options)

    def bucket(self, name: str) -> str:
        """Create bucket ``name``; returns ``s3://name``."""
        self.filesystem().mkdir(name)
        return f"s3://{name}"


@contextmanager
def s3_server(timeout: float = 60.0) -> Iterator[S3Server]:
    """moto's server on a free port; waits until it answers (or raises with its output), stops it after."""
    port = free_port()
    with tempfile.TemporaryFile() as log:  # not a pipe: moto logs every request, and a full pipe would stall it
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", port],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CREDENTIALS},
        )
        endpoint = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if process.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"moto server exited with {process.returncode}: {log.read().decode()[-3000:]}")
                try:
                    urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"moto server on {endpoint} did not answer within {timeout} s") from None
                    time.sleep(0.1)
            yield S3Server(endpoint)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
