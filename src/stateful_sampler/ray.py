"""Ray Train: the loader's consumed position in the ``ray.train.Checkpoint`` that ``ray.train.report`` saves.

Ray Train restarts a failed worker group (``FailureConfig(max_failures=...)``) and hands the last reported
checkpoint to the new workers (``ray.train.get_checkpoint()``), but carries no data position: ``report`` adds
the loader's state to the checkpoint, one JSON file written by rank 0 that holds every rank's RNG states
(``ResumableLoader.state_dict(every_rank=True)``), and ``restore`` loads it in ``train_loop_per_worker``.
A group that comes back at another size (an elastic ``ScalingConfig(num_workers=(min, max))`` restarted or resized
by Ray at the size the cluster has room for, or a new ``TorchTrainer`` at another ``num_workers`` given the
checkpoint's path) resumes by the elastic rule: every unconsumed record once, equal steps on each rank.
Ray Data's ``streaming_split`` is not used: its iterator has no resumable position (ray-project/ray#37633).
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.extras import missing_extra
from stateful_sampler.loader import LOADER_STATE_VERSION, LoaderState, ResumableLoader, find_sampler
from stateful_sampler.seeding.snapshot import capture_rank_rng_states, rank_rng_restorer

try:
    import ray.train
    from ray.train import Checkpoint
except ModuleNotFoundError as error:
    raise missing_extra(error, "ray", __name__) from error

STATE_FILE = "stateful_sampler.json"


def report(
    metrics: dict[str, Any],
    loader: Any,
    *,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    **report_options: Any,
) -> None:
    """``ray.train.report(metrics, checkpoint=...)`` with the loader's state in the checkpoint; call it on every rank.

    ``loader`` is a ``ResumableLoader`` (exact at any ``num_workers``, ``ShardedStream`` and packed rows
    included) or a ``DataLoader`` whose sampler is a ``StatefulSampler`` (exact at ``num_workers=0``; mid-pass
    with workers its drawn position is ahead of training: ``PrefetchedStateError``). ``checkpoint_dir`` is the
    folder this rank wrote its model and optimizer to, if any: rank 0 adds ``stateful_sampler.json`` to it (to
    a temporary folder without one), and Ray merges every rank's folder into one checkpoint.
    ``report_options`` go to ``ray.train.report`` (``checkpoint_dir_name``, ...).

    Example::

        with tempfile.TemporaryDirectory() as folder:
            torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
            stateful_sampler.ray.report({"loss": loss}, loader, checkpoint_dir=folder)   # instead of ray.train.report
    """
    state = _state(loader)  # a collective (every rank's RNG states to rank 0): before any rank returns
    with ExitStack() as stack:
        if ray.train.get_context().get_world_rank() == 0:
            folder = Path(checkpoint_dir or stack.enter_context(tempfile.TemporaryDirectory()))
            (folder / STATE_FILE).write_text(json.dumps(state))
            checkpoint_dir = folder
        checkpoint = Checkpoint.from_directory(os.fspath(checkpoint_dir)) if checkpoint_dir is not None else None
        ray.train.report(metrics, checkpoint=checkpoint, **report_options)


def restore(loader: Any, checkpoint: Checkpoint | str | os.PathLike[str] | None = None) -> bool:
    """Load the state ``report`` saved, from ``checkpoint`` (a ``Checkpoint`` or its path), by default
    ``ray.train.get_checkpoint()``; ``False`` when there is none (a first run). Call it just before the loop,
    after the model is built: it puts back the RNG states the model's initialisation would otherwise move.

    At the world size it was saved at, each rank gets its own RNG states back too; at another, the data
    resumes by the elastic rule and the RNGs are not restored (a warning says so).

    Example::

        def train_loop_per_worker(config):
            loader = ResumableLoader(DataLoader(ds, sampler=StatefulSampler(ds, batch_size=B), batch_size=B))
            stateful_sampler.ray.restore(loader, config.get("resume_from"))   # None: ray.train.get_checkpoint()
    """
    if checkpoint is None:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return False
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = Checkpoint(os.fspath(checkpoint))
    with checkpoint.as_directory() as folder:
        path = Path(folder) / STATE_FILE
        if not path.is_file():
            raise IncompatibleStateError(
                STATE_FILE,
                "<missing>",
                "a file of the checkpoint",
                f"checkpoint {checkpoint.path} was not reported by stateful_sampler.ray.report: the data position "
                f"is unknown",
            )
        saved = json.loads(path.read_text())
    if isinstance(loader, ResumableLoader):
        loader.load_state_dict(saved)
        return True
    state = LoaderState.from_dict(saved)  # everything is checked before anything changes
    restore_rngs = rank_rng_restorer(state.rng_states) if state.rng_states is not None else None
    find_sampler(loader).load_state_dict(state.sampler)
    if restore_rngs is not None:
        restore_rngs()
    return True


def _state(loader: Any) -> dict[str, Any]:
    """A ``ResumableLoader``'s state, or the same layout for a plain ``DataLoader``'s sampler."""
    if isinstance(loader, ResumableLoader):
        return loader.state_dict(every_rank=True)
    sampler_state = find_sampler(loader).state_dict()
    return LoaderState(LOADER_STATE_VERSION, sampler_state, capture_rank_rng_states(every_rank=True)).to_dict()
