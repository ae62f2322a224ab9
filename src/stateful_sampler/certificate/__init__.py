"""A certificate of the data a run trained on: a small append-only file per rank, a hash chain over each
step's records, with the run's seed, the order's fingerprint and every resume marked (docs/certificate.md).

Switch it on with ``STATEFUL_SAMPLER_CERTIFICATE=path`` in the training processes' environment (no change
to the script), or ``record_certificate(path)`` in it; compare two runs with
``stateful-sampler certificate compare A B``. A product: the core never imports it.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from torch.utils.data import DataLoader
    >>> from stateful_sampler import ResumableLoader, StatefulSampler
    >>> prefix = Path(tempfile.mkdtemp()) / "run.cert"
    >>> record_certificate(prefix)
    >>> loader = ResumableLoader(DataLoader(range(8), sampler=StatefulSampler(8, seed=3), batch_size=4))
    >>> batches = [batch.tolist() for batch in loader]
    >>> run = read_run(prefix)
    >>> [step.records() for step in run.steps] == batches
    True
    >>> stop_certificate()
"""

from __future__ import annotations

import os

from stateful_sampler.certificate.compare import Comparison, compare
from stateful_sampler.certificate.plugin import CERTIFICATE_ENV, stop, writer_for
from stateful_sampler.certificate.run import GlobalStep, Run, read_run
from stateful_sampler.loader import ResumableLoader
from stateful_sampler.sampler import StatefulSampler

__all__ = [
    "CERTIFICATE_ENV",
    "Comparison",
    "GlobalStep",
    "Run",
    "compare",
    "read_run",
    "record_certificate",
    "stop_certificate",
]


def record_certificate(path: str | os.PathLike[str], loader: ResumableLoader | None = None) -> None:
    """Write this process's certificate to ``path`` (its rank's file ``path.rank{r}``): the argument form of
    ``STATEFUL_SAMPLER_CERTIFICATE=path``, before the first pass. With ``loader``, of that loader's sampler
    (a process with several resumable loaders); else of the first whose pass starts."""
    order = loader.sampler if loader is not None else None
    if order is not None and not isinstance(order, StatefulSampler):
        raise TypeError(f"a certificate follows a StatefulSampler, the loader's order is {type(order).__name__}")
    writer_for(path, order)


def stop_certificate() -> None:
    """Stop recording in this process (the writer of ``record_certificate`` or of the variable): its file is
    closed, complete up to the last step."""
    stop()
