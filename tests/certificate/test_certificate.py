"""The certificate in one process: its chain, the supersede rule across simulated processes (each a fresh
writer and fresh loaders, as a restarted process has), the merge of ranks, compare's rules and exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from stateful_sampler import ResumableLoader, StatefulSampler
from stateful_sampler.certificate import compare, read_run, writer
from stateful_sampler.certificate.cli import main as certificate_main
from stateful_sampler.certificate.format import MAGIC, rank_path, read_rank_file, step_size
from stateful_sampler.certificate.plugin import hooked
from stateful_sampler.certificate.writer import CertificateWriter
from stateful_sampler.errors import CertificateError

SIZE, BATCH, EPOCHS, SEED = 24, 2, 2, 7


def make_loader(world_size: int, rank: int, size: int = SIZE, batch: int = BATCH) -> ResumableLoader:
    sampler = StatefulSampler(size, num_replicas=world_size, rank=rank, seed=SEED)
    return ResumableLoader(DataLoader(range(size), sampler=sampler, batch_size=batch), rng_states=False)


def run_process(
    prefix: Path,
    world_size: int,
    *,
    state: dict[str, Any] | None = None,
    steps: int | None = None,
    checkpoint_at: int = 0,
    size: int = SIZE,
) -> tuple[dict[str, Any] | None, list[list[int]]]:
    """One process of a run on ``world_size`` ranks in lockstep: every rank loads ``state`` (None: a process
    that restores nothing), trains ``steps`` global steps (None: to the end of the run), and rank 0 takes the
    state after ``checkpoint_at`` of them (0: none). Returns that state and the global batches trained."""
    loaders = [make_loader(world_size, rank, size) for rank in range(world_size)]
    removers = [hooked(CertificateWriter(prefix, loader.sampler)) for loader in loaders]
    taken = None
    trained: list[list[int]] = []
    try:
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(state)
        while (steps is None or len(trained) < steps) and loaders[0].epoch < EPOCHS:
            iterators = [iter(loader) for loader in loaders]
            while True:
                batches = [next(iterator, None) for iterator in iterators]  # each rank sees its pass end
                if any(batch is None for batch in batches):
                    assert all(batch is None for batch in batches), "the ranks' passes differ in length"
                    break
                trained.append(np.stack(batches, axis=1).reshape(-1).tolist())  # in global position order
                if len(trained) == checkpoint_at:
                    taken = loaders[0].state_dict()
                if steps is not None and len(trained) >= steps:
                    break
    finally:
        for remove in removers:
            remove()
    return taken, trained


def test_a_run_certifies_its_batches_and_grows_a_fixed_size_a_step(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(writer, "WRITE_STEPS", 16)  # a block shorter than the epoch's 32 steps
    prefix = tmp_path / "run"
    loader = make_loader(1, 0, size=64)
    remove = hooked(CertificateWriter(prefix, loader.sampler))
    try:
        batches = iter(loader)
        first = next(batches).tolist()
        started = read_rank_file(rank_path(prefix, 0)).valid_length  # read while the run writes: the start record
        rest = [next(batches).tolist() for _ in range(writer.WRITE_STEPS - 1)]
        grown = read_rank_file(rank_path(prefix, 0)).valid_length - started  # the block of the first steps
        assert grown == writer.WRITE_STEPS * step_size(BATCH, 4) and step_size(BATCH, 4) == 1 + 60 + 4 * BATCH
        rest += [next(batches).tolist() for _ in range(3)]
        assert read_rank_file(rank_path(prefix, 0)).valid_length - started == grown  # counted, not written yet
        loader.state_dict()  # a checkpoint: every step trained before it is written, then its record
        file = read_rank_file(rank_path(prefix, 0))
        assert len(file.segments[0].steps) == writer.WRITE_STEPS + 3 and file.segments[0].checkpoints[0]["step"] == 19
        rest += [batch.tolist() for batch in batches]
        while loader.epoch < EPOCHS:
            rest += [batch.tolist() for batch in loader]
    finally:
        remove()
    assert rank_path(prefix, 0).stat().st_size == read_rank_file(rank_path(prefix, 0)).valid_length  # closed: no tail
    run = read_run(prefix)
    assert [step.records() for step in run.steps] == [first, *rest]
    assert [step.step for step in run.steps] == list(range(EPOCHS * 64 // BATCH))
    assert run.identity["seed"] == SEED and run.identity["size"] == 64
    assert rank_path(prefix, 0).read_bytes().startswith(MAGIC)


def test_a_resume_supersedes_the_steps_after_its_checkpoint(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    _, expected = run_process(plain, 1)
    killed = tmp_path / "killed"
    state, before_kill = run_process(killed, 1, steps=9, checkpoint_at=5)  # steps 5..8 trained, then lost
    _, after = run_process(killed, 1, state=state)
    assert before_kill[:5] + after == expected
    files = [read_rank_file(rank_path(killed, 0))]
    assert [len(segment.steps) for segment in files[0].segments] == [9, len(expected) - 5]
    run = read_run(killed)
    assert [step.records() for step in run.steps] == expected
    assert [start["start_step"] for start in run.starts] == [0, 5]
    assert run.starts[1]["restored"] and run.starts[1]["resumed_from"]["position"] == 5 * BATCH
    comparison = compare(read_run(plain), run)
    assert (comparison.code, comparison.rule) == (0, "step by step"), comparison.report()
    assert read_run(plain).digest() == run.digest()


def test_a_process_that_did_not_restore_the_loader_differs_at_the_checkpoint(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    _, expected = run_process(plain, 1)
    broken = tmp_path / "broken"
    run_process(broken, 1, steps=9, checkpoint_at=5)
    run_process(broken, 1)  # the weights came back from the checkpoint, the data position did not
    run = read_run(broken)
    assert run.starts[1]["continued"] and not run.starts[1]["restored"] and run.starts[1]["start_step"] == 5
    comparison = compare(read_run(plain), run)
    assert comparison.code == 1 and comparison.first_difference == 5
    report = comparison.report()
    assert "DIFFERENT: first at step 5 (epoch 0)" in report
    assert f"plain: step 5, epoch 0, positions [10, 12), world size 1: records {expected[5]}" in report
    assert f"broken: step 5, epoch 0, positions [0, 2), world size 1: records {expected[0]}" in report
    assert "1 restarts WITHOUT the loader state restored" in report


def test_a_resize_is_equal_by_the_multiset_rule_and_names_the_layouts(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    run_process(plain, 2)
    resized = tmp_path / "resized"
    state, _ = run_process(resized, 2, steps=4, checkpoint_at=3)
    run_process(resized, 1, state=state)  # rank 1's steps 3.. are superseded although it never comes back
    run = read_run(resized)
    assert [step.world_size for step in run.steps[:4]] == [2, 2, 2, 1]
    comparison = compare(read_run(plain), run)
    assert (comparison.code, comparison.rule) == (0, "multiset per epoch"), comparison.report()
    assert "epoch 0: 2 x 2 vs 2 x 2 -> 1 x 2" in comparison.report()


def test_a_reordered_epoch_at_the_same_layout_is_different(tmp_path: Path) -> None:
    plain, other = tmp_path / "plain", tmp_path / "other"
    run_process(plain, 1)
    remove = hooked(CertificateWriter(other))
    try:
        sampler = StatefulSampler(SIZE, seed=SEED)
        loader = ResumableLoader(DataLoader(range(SIZE), sampler=sampler, batch_size=BATCH), rng_states=False)
        for _ in range(EPOCHS):
            list(loader)
    finally:
        remove()
    assert compare(read_run(plain), read_run(other)).code == 0  # the same run, written by the default follower
    swapped = tmp_path / "swapped"
    run_process(swapped, 1, steps=3)
    comparison = compare(read_run(plain), read_run(swapped))
    assert comparison.code == 1 and comparison.first_difference == 3
    assert "swapped: step 3: none (the run ends after 3 steps)" in comparison.report()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kills=st.lists(st.tuples(st.integers(1, 14), st.integers(0, 14), st.sampled_from([1, 2])), min_size=1, max_size=3),
    last_world=st.sampled_from([1, 2]),
)
def test_any_kills_and_resizes_certify_the_uninterrupted_data(
    tmp_path_factory: pytest.TempPathFactory, kills: list[tuple[int, int, int]], last_world: int
) -> None:
    """The twin property of a certificate: killed anywhere (checkpoints anywhere before the kill, or none),
    resumed at any world size, it equals the uninterrupted run's: step by step when no resize happened."""
    root = tmp_path_factory.mktemp("kills")
    plain, killed = root / "plain", root / "killed"
    run_process(plain, 2)
    state = None
    for steps, checkpoint, world_size in kills:
        taken, _ = run_process(killed, world_size, state=state, steps=steps, checkpoint_at=min(checkpoint, steps))
        state = taken if taken is not None else state
        if state is None:  # no checkpoint yet: the next process starts the run again from step 0
            state = make_loader(1, 0).state_dict()
    run_process(killed, last_world, state=state)
    comparison = compare(read_run(plain), read_run(killed))
    assert comparison.code == 0, comparison.report()
    resized = any(world != 2 for _, _, world in kills) or last_world != 2
    assert comparison.rule == ("multiset per epoch" if resized else "step by step") or (
        resized and comparison.rule == "step by step"  # a resize whose steps were all superseded
    )


def test_an_altered_or_torn_file(tmp_path: Path) -> None:
    prefix = tmp_path / "run"
    state, _ = run_process(prefix, 1, steps=4, checkpoint_at=4)
    path = rank_path(prefix, 0)
    with path.open("ab") as file:
        file.write(b"T" + bytes(20))  # a step cut short by a kill -9 mid-write
    assert len(read_run(prefix).steps) == 4
    run_process(prefix, 1, state=state)  # the next process cuts the torn tail off before it appends
    plain = tmp_path / "plain"
    run_process(plain, 1)
    assert compare(read_run(plain), read_run(prefix)).code == 0
    data = bytearray(path.read_bytes())
    data[_first_step_offset(bytes(data)) + 50] ^= 1  # a key of the first step
    path.write_bytes(bytes(data))
    with pytest.raises(CertificateError, match=r"does not chain|corrupt"):
        read_run(prefix)
    assert certificate_main(["compare", str(plain), str(prefix)]) == 2


def _first_step_offset(data: bytes) -> int:
    """Where the first step record begins: after the magic and the start record (a tag, a length, JSON)."""
    assert data[len(MAGIC) : len(MAGIC) + 1] == b"M"
    return len(MAGIC) + 5 + int.from_bytes(data[len(MAGIC) + 1 : len(MAGIC) + 5], "little")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(0, 11), place=st.integers(0, step_size(BATCH, 4) - 17))
def test_a_byte_changed_in_any_step_of_a_block_breaks_its_chain(tmp_path: Path, step: int, place: int) -> None:
    """A block's link covers each of its steps, not only the last one, which carries it."""
    prefix = tmp_path / f"run{step}_{place}"
    run_process(prefix, 1)  # one block an epoch: 12 steps of 2 records
    path = rank_path(prefix, 0)
    data = bytearray(path.read_bytes())
    offset = _first_step_offset(bytes(data)) + step * step_size(BATCH, 4) + 1 + place  # after the tag
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CertificateError, match=r"does not chain|corrupt|keys in"):
        read_run(prefix)


@pytest.mark.parametrize("size", [(1 << 31) - 1, 1 << 31])
def test_keys_take_four_bytes_below_two_to_the_31_records_and_eight_from_there(tmp_path: Path, size: int) -> None:
    """The width is the segment's (its start record says it), and the records read back are the same either way."""
    prefix = tmp_path / "run"
    loader = ResumableLoader(DataLoader(range(size), sampler=StatefulSampler(size, seed=SEED), batch_size=BATCH),
                             rng_states=False)  # fmt: skip
    remove = hooked(CertificateWriter(prefix, loader.sampler))
    try:
        batches = iter(loader)
        trained = [next(batches).tolist() for _ in range(5)]
        loader.state_dict()  # a checkpoint: the steps are written
    finally:
        remove()
    file = read_rank_file(rank_path(prefix, 0))
    key_bytes = 4 if size < 1 << 31 else 8
    assert file.segments[0].start["key_bytes"] == key_bytes
    assert [step.records() for step in file.segments[0].steps] == trained
    assert max(max(batch) for batch in trained) >= 1 << 20  # large keys, not only small ones
    steps = rank_path(prefix, 0).stat().st_size - _first_step_offset(rank_path(prefix, 0).read_bytes())
    assert steps - len(file.unsealed) == 5 * step_size(BATCH, key_bytes)  # then the checkpoint record


def test_a_start_record_changed_breaks_the_chain(tmp_path: Path) -> None:
    """The chain runs through the whole file: a process's start record (its seed here) is covered by the link
    of the block after it, so a certificate cannot be made to claim another run's identity."""
    prefix = tmp_path / "run"
    run_process(prefix, 1)
    path = rank_path(prefix, 0)
    data = path.read_bytes()
    assert data.count(f'"seed": {SEED}'.encode()) == 1
    path.write_bytes(data.replace(f'"seed": {SEED}'.encode(), f'"seed": {SEED + 1}'.encode()))
    with pytest.raises(CertificateError, match="step 0 does not chain"):
        read_run(prefix)


def test_an_unsealed_block_at_the_end_is_left_out_and_cut_off(tmp_path: Path) -> None:
    """Steps written without their block's seal (a write cut short) are not read, and the next process cuts
    them off before it appends."""
    prefix = tmp_path / "run"
    state, trained = run_process(prefix, 1, steps=4, checkpoint_at=4)
    path = rank_path(prefix, 0)
    data = path.read_bytes()
    first = _first_step_offset(data)
    with path.open("ab") as file:
        file.write(data[first : first + 2 * step_size(BATCH, 4)])  # two whole steps; neither seals a block
    assert [step.records() for step in read_run(prefix).steps] == trained
    assert read_rank_file(path).valid_length == len(data)
    run_process(prefix, 1, state=state)
    plain = tmp_path / "plain"
    run_process(plain, 1)
    assert compare(read_run(plain), read_run(prefix)).code == 0


def test_compare_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    run_process(first, 1)
    run_process(second, 1)
    run_process(other, 1, size=SIZE + 2)
    assert certificate_main(["compare", str(first), str(second)]) == 0
    assert "EQUAL: the same data step by step" in capsys.readouterr().out
    assert certificate_main(["compare", str(first), str(other)]) == 2
    assert "COULD NOT COMPARE: another dataset or order (size: 24 vs 26)" in capsys.readouterr().out
    assert certificate_main(["compare", str(first), str(tmp_path / "missing")]) == 2
    assert "no certificate files" in capsys.readouterr().out
    (tmp_path / "junk.rank0").write_bytes(b"not a certificate")
    assert certificate_main(["compare", str(first), str(tmp_path / "junk")]) == 2
    assert "not a stateful-sampler certificate" in capsys.readouterr().out


def test_a_missing_rank_is_refused(tmp_path: Path) -> None:
    prefix = tmp_path / "run"
    run_process(prefix, 2)
    rank_path(prefix, 1).unlink()
    with pytest.raises(CertificateError, match=r"step 0 has ranks \[0\], its run had 2"):
        read_run(prefix)


def test_keys_mark_padding(tmp_path: Path) -> None:
    prefix = tmp_path / "run"
    run_process(prefix, 2, size=SIZE + 1)  # pad: one repeat in each epoch's last step
    run = read_run(prefix)
    last = next(step for step in run.steps if step.epoch == 0 and step.after - step.before == 2)
    assert int(np.count_nonzero(last.keys >> np.uint64(63))) == 1
