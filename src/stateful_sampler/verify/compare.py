"""Compare an uninterrupted run with a killed-and-resumed one, batch by batch and weight by weight."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stateful_sampler.verify.fingerprint import batch_fingerprint
from stateful_sampler.verify.recorder import BatchRecord, RunRecord


@dataclass(frozen=True)
class ResumeReport:
    """The verdict, with the evidence: what was compared and, if anything differs, the first difference."""

    kill_at: int  # optimizer steps done when the killed run was killed
    resumed_from: int | None  # step of the last checkpoint the killed run wrote
    batches_compared: int  # reference batches (one per rank and step)
    identical_batches: int  # reference batches every other run's copy of which matched
    ranks: int
    first_divergence: str | None  # the earliest difference in training order, described
    reference_weights: str | None  # fingerprint of the final weights
    resumed_weights: str | None
    weight_divergence: str | None
    weights_cause: str | None  # why the weights differ when every batch was identical
    reference: RunRecord
    killed: RunRecord
    resumed: RunRecord
    kill_steps: tuple[int, ...] = ()  # with several kills (``--kills N``): each, in order
    resumed_froms: tuple[int, ...] = ()  # the step each resumed process started at

    @property
    def equal(self) -> bool:
        return self.first_divergence is None and self.weight_divergence is None


# What a resumed run that started elsewhere than the last checkpoint did wrong, for any runner.
NOT_RESUMED = "the run did not resume from it"
RNG_FIX = (
    "restore the RNG states with the data: ResumableLoader and SamplerCheckpoint restore them by default "
    "(stateful_sampler.seeding.snapshot.restore_rng_states); a checkpoint of your own saves "
    "capture_rng_states() and calls restore_rng_states(saved) after loading it"
)


# The right records with other values: a dataset's own random draws, which come from RNG streams a resume restarts.
AUGMENTATION_FIX = (
    "A dataset that draws its own augmentation (torch.rand, np.random, random in __getitem__) takes it from its "
    "DataLoader worker's RNG stream, which a resume (or another worker count) starts over: wrap it in "
    "stateful_sampler.seeding.SeededDataset(dataset), which seeds each record's draws from (seed, epoch, index); "
    "if it is one already, a generator the dataset builds itself is not seeded: define load_sample(index, rng) "
    "and draw from rng.numpy or rng.torch"
)


def compare_runs(
    reference: RunRecord, killed: RunRecord, resumed: RunRecord, kill_at: int, *, not_resumed: str = NOT_RESUMED
) -> ResumeReport:
    """Every batch the killed run trained on before its death and every batch of the resumed run must
    equal the reference's batch at the same (epoch, batch, rank); together they must cover it; the
    resumed run must start at the last checkpoint (``not_resumed`` says what went wrong when it did
    not); the final weights must be bitwise equal. When only the weights differ, the RNG states
    recorded with each batch say whether the model's randomness was restored."""
    expected = {record.key: record for record in reference.batches}
    differences: list[tuple[tuple[int, int, int], str]] = []
    matching = set(expected)
    seen: set[tuple[int, int, int]] = set()
    for run_name, run in (("killed", killed), ("resumed", resumed)):
        for record in run.batches:
            seen.add(record.key)
            want = expected.get(record.key)
            if want is None:
                extra = f"{where(record)}: the {run_name} run has a batch the uninterrupted run never had"
                differences.append((record.key, extra))
            elif (want.fingerprint, want.indices) != (record.fingerprint, record.indices):
                matching.discard(record.key)
                differences.append((record.key, describe_mismatch(run_name, want, record)))
    for key in sorted(set(expected) - seen):
        matching.discard(key)
        differences.append(
            (key, f"{where(expected[key])}: neither the killed nor the resumed run trained on this batch")
        )
    resumed_from = max(killed.checkpoint_steps, default=None)
    start_problem = start_problem_of(resumed, resumed_from, kill_at, not_resumed)
    if start_problem is not None:
        differences.append(((-1, -1, -1), start_problem))
    weight_divergence = _weight_divergence(reference, resumed)
    weights_cause = None
    if weight_divergence is not None and not differences and resumed.weights is not None:
        weights_cause = _weights_cause(expected, killed, resumed)
    return ResumeReport(
        kill_at=kill_at,
        resumed_from=resumed_from,
        batches_compared=len(expected),
        identical_batches=len(matching),
        ranks=len({record.rank for record in reference.batches}),
        first_divergence=min(differences)[1] if differences else None,
        reference_weights=_fingerprint(reference),
        resumed_weights=_fingerprint(resumed),
        weight_divergence=weight_divergence,
        weights_cause=weights_cause,
        reference=reference,
        killed=killed,
        resumed=resumed,
    )


def where(record: BatchRecord) -> str:
    return f"step {record.step} (epoch {record.epoch}, batch {record.batch_idx}), rank {record.rank}"


def describe_mismatch(run_name: str, want: BatchRecord, got: BatchRecord) -> str:
    lines = [
        f"{where(got)}: the {run_name} run trained on another batch than the uninterrupted run",
        f"  expected fingerprint {want.fingerprint}, got {got.fingerprint}",
    ]
    if want.indices != got.indices:
        lines.append(f"  expected indices {want.indices}")
        lines.append(f"  got indices      {got.indices}")
    elif want.indices is not None:
        lines.append(f"  same indices {want.indices}: the augmentation differs. {AUGMENTATION_FIX}")
    return "\n".join(lines)


def start_problem_of(resumed: RunRecord, resumed_from: int | None, kill_at: int, not_resumed: str) -> str | None:
    """Why a run resumed after a kill at ``kill_at`` did not start at the last checkpoint; None if it did."""
    if resumed_from is None:
        return f"the killed run wrote no checkpoint before step {kill_at}: kill later or checkpoint more often"
    if not resumed.batches:
        return "the resumed run trained on no batch"
    first = resumed.batches[0]
    if first.step != resumed_from:
        where = "from the beginning" if first.step == 0 else f"at step {first.step}"
        return (
            f"the resumed run started {where} (epoch {first.epoch}, batch {first.batch_idx}), not at the last "
            f"checkpoint (step {resumed_from}): {not_resumed}"
        )
    return None


_RNG_NAMES = {"torch": "torch", "cuda": "CUDA", "numpy": "NumPy", "random": "random"}


def _weights_cause(expected: dict[tuple[int, int, int], BatchRecord], killed: RunRecord, resumed: RunRecord) -> str:
    """Every batch was identical and the weights are not: the RNG states recorded with the batches
    say whether the runs start alike and whether the resume restored the model's randomness. An RNG
    that already differs between the two fresh runs (NumPy's, Python's, when the script never seeds
    them) cannot be checked, and is left out unless it is torch's."""
    if not killed.batches or any(record.rng is None for run in (killed, resumed) for record in run.batches):
        return (
            "the data resumed exactly; the final weights did not: the model's randomness (dropout, ...) was not "
            f"restored, or the model's or optimizer's state was not. Fix: {RNG_FIX}"
        )
    first = killed.batches[0]
    reference_rng, killed_rng = expected[first.key].rng or {}, first.rng or {}
    seeded = [name for name in _RNG_NAMES if name in reference_rng and reference_rng[name] == killed_rng.get(name)]
    if "torch" not in seeded:
        return (
            f"the data resumed exactly, but the runs do not start alike: at {where(first)} the killed run's torch "
            f"RNG state is not the uninterrupted run's, before any resume: seed the training (torch.manual_seed, "
            f"Lightning's seed_everything) before the model is built"
        )
    for record in resumed.batches:
        want = expected[record.key].rng or {}
        differ = [_RNG_NAMES[name] for name in seeded if want[name] != (record.rng or {}).get(name)]
        if differ:
            return (
                f"the data resumed exactly; the model's randomness (dropout, ...) was not restored: from "
                f"{where(record)} the resumed run's RNG state ({', '.join(differ)}) is not the uninterrupted "
                f"run's. Fix: {RNG_FIX}"
            )
    return (
        "the data and the RNG states resumed exactly, the weights did not: the model's or optimizer's state "
        "(momentum, an LR scheduler, a gradient scaler) was not restored from the checkpoint, or a kernel is "
        "not deterministic"
    )


def _weight_divergence(reference: RunRecord, resumed: RunRecord) -> str | None:
    if reference.weights is None or resumed.weights is None:
        return "final weights missing: a run did not reach the end of training"
    if reference.weights.keys() != resumed.weights.keys():
        return f"the weights have other names: {sorted(reference.weights)} vs {sorted(resumed.weights)}"
    for name, want in reference.weights.items():
        got = resumed.weights[name]
        if want.dtype != got.dtype or want.shape != got.shape or not torch.equal(want, got):
            gap = (want.double() - got.double()).abs().max().item() if want.shape == got.shape else float("nan")
            return f"final weight {name!r} differs: max |difference| {gap:.3g}"
    return None


def _fingerprint(run: RunRecord) -> str | None:
    return None if run.weights is None else batch_fingerprint(run.weights)
