"""The certificate under Lightning: ``SamplerCheckpoint`` drives the train loader itself, with no
``ResumableLoader`` to fire the batch and state hooks, so it reports each train batch and checkpoint to this
observer (``stateful_sampler.hooks.add_trainer_observer``). A validation loader's batches are never reported,
so the certificate follows the train loader's first ``StatefulSampler``."""

from __future__ import annotations

from typing import Any

from stateful_sampler.certificate.writer import CertificateWriter


class TrainerCertificate:
    """Writes a fit's train steps and checkpoints through ``writer``."""

    def __init__(self, writer: CertificateWriter) -> None:
        self._writer = writer

    def batch(self, trainer: Any, batch: Any, batch_idx: int) -> None:
        from stateful_sampler.lightning.loaders import train_samplers  # a Lightning fit is under way

        samplers = train_samplers(trainer)
        if samplers:
            self._writer.trained(samplers[0])

    def checkpoint(self, trainer: Any) -> None:
        self._writer.checkpoint_taken()

    def train_end(self, trainer: Any, module: Any) -> None:
        return None  # every step is in the file already

    def close(self) -> None:
        self._writer.end_segment()  # a later fit in this process appends a segment of its own
