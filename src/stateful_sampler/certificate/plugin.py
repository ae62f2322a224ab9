"""The certificate's plug-in to the core: ``STATEFUL_SAMPLER_CERTIFICATE=path`` switches it on
(``stateful_sampler.plugins.SWITCHES``), and the core installs it when the run's first ``ResumableLoader``
or ``SamplerCheckpoint`` is set up; the user's script is not edited."""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable

from stateful_sampler.certificate.trainer import TrainerCertificate
from stateful_sampler.certificate.writer import CertificateWriter
from stateful_sampler.hooks import (
    add_batch_hook,
    add_pass_start_hook,
    add_state_hook,
    add_state_loaded_hook,
    add_trainer_observer,
)
from stateful_sampler.sampler import StatefulSampler

CERTIFICATE_ENV = "STATEFUL_SAMPLER_CERTIFICATE"

_writer: CertificateWriter | None = None


def install() -> None:
    """Write the certificate this process's variable names (``stateful_sampler.plugins.install``)."""
    path = os.environ.get(CERTIFICATE_ENV)
    if path:
        writer_for(path)


def writer_for(path: str | os.PathLike[str], order: StatefulSampler | None = None) -> CertificateWriter:
    """The process's writer (of ``order``, else of the first ``StatefulSampler`` whose pass starts), installed on
    the core's hooks; a call with another path or order replaces the previous writer (the latest call wins)."""
    global _writer, _remove
    if _writer is not None and _writer.prefix == CertificateWriter(path).prefix and order is None:
        return _writer
    _remove()
    _writer = writer = CertificateWriter(path, order)
    _remove = hooked(writer)
    return writer


def hooked(writer: CertificateWriter) -> Callable[[], None]:
    """Puts ``writer`` on the core's state-loaded, pass-start, batch and state hooks, and offers it to every
    ``SamplerCheckpoint`` fit as a trainer observer; the call returned takes it off them again and closes its
    file."""
    removers = [
        add_state_loaded_hook(writer.state_loaded),
        add_pass_start_hook(writer.pass_started),
        add_batch_hook(writer.batch),
        add_state_hook(writer.state_taken),
        add_trainer_observer(lambda: TrainerCertificate(writer)),
    ]

    def remove() -> None:
        for remover in removers:
            remover()
        writer.close()

    return remove


def stop() -> None:
    """Take the process's writer off the core's hooks and close its file: nothing more is recorded."""
    global _writer, _remove
    _remove()
    _writer, _remove = None, _nothing


def _close_at_exit() -> None:
    _remove()  # cut the file's mapped tail off (a reader stops at it anyway)


def _nothing() -> None:
    return None


_remove: Callable[[], None] = _nothing
atexit.register(_close_at_exit)
