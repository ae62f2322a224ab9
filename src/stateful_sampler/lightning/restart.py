"""Make a checkpoint's fit-loop state agree with ``SamplerCheckpoint``'s before Lightning reads it.

Two things in a Lightning checkpoint contradict the position the callback saved:

- A fit that stops mid-epoch on ``max_steps`` (or ``should_stop``) still runs the epoch-end step
  of its fit loop, so a checkpoint written then, or by ``trainer.save_checkpoint`` after ``fit``
  returned, counts the epoch as processed while its batch progress is mid-epoch. Resumed, Lightning
  runs the rest of the epoch but calls ``set_epoch`` with the next epoch's number, and counts one
  epoch too many from then on (``max_epochs`` stops a whole epoch early). The stopped epoch is
  marked unfinished, as a mid-epoch step checkpoint would have it.
- A loader with its own ``state_dict`` (torchdata's ``StatefulDataLoader``) saves a second
  position, which Lightning restores into the same sampler, at another moment, and not at all when
  ``estimated_stepping_batches`` was read early (#20550). Its saved state is dropped, so the
  callback's position is the only one.
- A checkpoint written at an epoch's end from ``on_train_epoch_end`` (``ModelCheckpoint``'s
  end-of-epoch save) or after ``fit`` returned holds an epoch that Lightning counts as processed
  but, inside the hook, not yet completed, and the finished epoch's batch progress. With
  ``max_steps`` set, Lightning restarts such a checkpoint *inside* the finished epoch: it skips
  ``on_train_epoch_start``, takes one more batch into the finished epoch (validation has not run
  since the restart) and only then starts the next. The finished epoch is marked completed and
  its batch progress emptied, so the resume starts the next epoch as an uninterrupted fit does.
"""

from __future__ import annotations

from typing import Any


def mark_epoch_unfinished(checkpoint: dict[str, Any], epoch: int) -> None:
    """Count ``epoch``, whose batches the checkpoint's batch progress holds, as not yet processed."""
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress")
    if progress is None:
        return
    for tracker in (progress["total"], progress["current"]):
        if tracker["processed"] > epoch:
            tracker["processed"] = tracker["completed"] = epoch


def start_next_epoch(checkpoint: dict[str, Any], epoch: int) -> None:
    """Count ``epoch``, whose batches were all processed, as completed, with no batch of the next
    epoch begun: the checkpoint then restarts where the next epoch starts."""
    fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = fit_loop.get("epoch_progress")
    batches = fit_loop.get("epoch_loop.batch_progress")
    if progress is None or batches is None or progress["current"]["processed"] != epoch + 1:
        return  # saved before Lightning counted the epoch processed: it finishes the epoch itself
    for tracker in (progress["total"], progress["current"]):
        tracker["completed"] = tracker["processed"]
    batches["current"] = {name: 0 for name in batches["current"]}
    batches["is_last_batch"] = False


def complete_saved_batch(checkpoint: dict[str, Any]) -> None:
    """Count the batch a checkpoint was saved after as completed (Lightning < 2.5 only).

    ``ModelCheckpoint`` saves in ``on_train_batch_end``, before the batch counts as completed, and
    Lightning < 2.5 restarts from the completed count: it runs that batch's index again and expects
    one batch more in the epoch, while the samplers go on after it. Lightning 2.5 counts it itself.
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = fit_loop.get("epoch_loop.batch_progress")
    if progress is None or progress["current"]["completed"] != progress["current"]["processed"] - 1:
        return
    for tracker in (progress["total"], progress["current"]):
        tracker["completed"] = tracker["processed"]
    if progress.get("is_last_batch"):  # the epoch's last batch: the epoch is over, as 2.5 counts it
        for tracker in (fit_loop["epoch_progress"]["total"], fit_loop["epoch_progress"]["current"]):
            tracker["processed"] = tracker["completed"] = tracker["started"]


def drop_loader_states(checkpoint: dict[str, Any], indices: list[int]) -> None:
    """Empty the saved states of the loaders at ``indices`` (an empty state restores nothing in a
    ``StatefulDataLoader``). When that is all of them, no state is left for Lightning to restore:
    a ``ResumableLoader`` refuses an empty state, and the callback's position is the one to use."""
    fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
    states = fit_loop.get("state_dict", {}).get("combined_loader")
    if not states:
        return
    if set(range(len(states))) <= set(indices):
        states.clear()
        return
    for index in indices:
        if index < len(states):
            states[index] = {}
