"""verify's plug-in to the core: the module verify names in ``STATEFUL_SAMPLER_PLUGINS`` for every
run it starts (``stateful_sampler.plugins``), so the core records for verify without importing it.

Installed by the core (its ``install()``, called once) when the run's first ``ResumableLoader`` or
``SamplerCheckpoint`` is set up, it installs the recording of this process through the core's hooks: the loader's batch and state
hooks with the sampler's pass-start hook, and a trainer observer for ``SamplerCheckpoint``. The
process's one recorder goes to whichever asks first (``claim_recorder``), so no batch is recorded
twice: verify's own LightningCLI callback, then ``SamplerCheckpoint``, then the loader hooks.
"""

from __future__ import annotations

import os

from stateful_sampler.hooks import add_batch_hook, add_pass_start_hook, add_state_hook, add_trainer_observer
from stateful_sampler.verify.loader_hook import LazyLoaderRecording
from stateful_sampler.verify.recorder import RECORD_ENV
from stateful_sampler.verify.trainer_recording import TrainerRecording

MODULE = __name__  # the name verify puts in STATEFUL_SAMPLER_PLUGINS


def install() -> None:
    """Record this process through the core's hooks, when verify runs it (``stateful_sampler.plugins.install``)."""
    if not os.environ.get(RECORD_ENV):
        return  # the variable was inherited by a process verify does not record
    add_trainer_observer(TrainerRecording.claim)
    recording = LazyLoaderRecording()
    add_pass_start_hook(recording.pass_started)
    add_batch_hook(recording.batch)
    add_state_hook(recording.state_taken)
