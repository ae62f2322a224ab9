"""``order/classes.py`` on its own: the records of each class in index order, and a class's draws, evaluated a
block at a time, as a bijection onto that class's records for each permutation."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from stateful_sampler.order.classes import ClassTable

KEYS = st.integers(0, 2**64 - 1)


def every_draw(table: ClassTable, klass: int, permutation: int, key: int) -> np.ndarray:
    size = int(table.sizes[klass])
    classes = np.full(size, klass, dtype=np.int64)
    permutations = np.full(size, permutation, dtype=np.uint64)
    return table.draws(classes, permutations, np.arange(size, dtype=np.int64), key)


def test_classes_are_the_distinct_labels_ascending_with_their_records_in_index_order() -> None:
    labels = np.array([7, -2, 7, 3, -2, 7, 3, 3, 3])
    table = ClassTable(labels)
    assert len(table) == 3
    assert table.ids.tolist() == [-2, 3, 7]
    assert table.sizes.tolist() == [2, 4, 3]
    assert table.starts.tolist() == [0, 2, 6]
    assert table.records.tolist() == [1, 4, 3, 6, 7, 8, 0, 2, 5]
    assert table.records.dtype == np.int32


def test_the_draws_of_a_fixed_key_are_pinned() -> None:
    """A change here reorders every saved ``Stratified`` run: it must be deliberate (and refused on resume)."""
    table = ClassTable(np.arange(40) % 3)
    assert every_draw(table, 0, 0, key=12345).tolist() == [33, 0, 15, 36, 6, 3, 12, 39, 18, 27, 30, 24, 9, 21]
    assert every_draw(table, 2, 1, key=12345).tolist() == [5, 20, 23, 8, 17, 26, 14, 35, 29, 11, 2, 38, 32]


@given(labels=st.lists(st.integers(-5, 5), min_size=1, max_size=200))
def test_each_class_holds_exactly_its_records_ascending(labels: list[int]) -> None:
    array = np.array(labels)
    table = ClassTable(array)
    assert table.ids.tolist() == sorted(set(labels))
    assert sorted(table.records.tolist()) == list(range(len(labels)))
    for klass, label in enumerate(table.ids.tolist()):
        start, size = int(table.starts[klass]), int(table.sizes[klass])
        assert table.records[start : start + size].tolist() == np.flatnonzero(array == label).tolist()


@given(labels=st.lists(st.integers(0, 6), min_size=1, max_size=300), permutation=st.integers(0, 2**64 - 1), key=KEYS)
def test_a_permutation_of_a_class_is_a_bijection_onto_its_records(
    labels: list[int], permutation: int, key: int
) -> None:
    table = ClassTable(np.array(labels))
    for klass in range(len(table)):
        start, size = int(table.starts[klass]), int(table.sizes[klass])
        drawn = every_draw(table, klass, permutation, key)
        assert drawn.dtype == np.int64
        assert sorted(drawn.tolist()) == sorted(table.records[start : start + size].tolist())


def test_bijections_across_the_small_and_large_domain_rounds() -> None:
    """Classes up to 1024 records take 12 rounds, larger ones 6: both are bijections, and one block mixing them
    gives each element what it gets alone."""
    sizes = [1, 2, 3, 1023, 1024, 1025, 4097]
    labels = np.repeat(np.arange(len(sizes)), sizes)
    table = ClassTable(np.random.default_rng(0).permutation(labels))
    for klass, size in enumerate(sizes):
        for permutation in (0, 1, 2**63 + 5):
            drawn = every_draw(table, klass, permutation, key=99)
            assert np.array_equal(np.sort(drawn), np.sort(table.records[table.starts[klass] :][:size]))
    rng = np.random.default_rng(1)
    classes = rng.integers(0, len(sizes), 500)
    ranks = rng.integers(0, np.array(sizes)[classes])
    permutations = rng.integers(0, 3, 500).astype(np.uint64)
    block = table.draws(classes, permutations, ranks, key=7)
    alone = [int(table.draws(classes[i : i + 1], permutations[i : i + 1], ranks[i : i + 1], 7)[0]) for i in range(500)]
    assert block.tolist() == alone


@given(
    labels=st.lists(st.integers(0, 4), min_size=1, max_size=120),
    data=st.data(),
    key=KEYS,
)
def test_a_mixed_block_gives_each_draw_what_it_gets_alone(labels: list[int], data: st.DataObject, key: int) -> None:
    table = ClassTable(np.array(labels))
    count = data.draw(st.integers(1, 40))
    classes = np.array(data.draw(st.lists(st.integers(0, len(table) - 1), min_size=count, max_size=count)))
    permutations = np.array(data.draw(st.lists(st.integers(0, 3), min_size=count, max_size=count)), dtype=np.uint64)
    ranks = np.array([data.draw(st.integers(0, int(table.sizes[c]) - 1)) for c in classes], dtype=np.int64)
    block = table.draws(classes, permutations, ranks, key)
    alone = [table.draws(classes[i : i + 1], permutations[i : i + 1], ranks[i : i + 1], key)[0] for i in range(count)]
    assert block.tolist() == [int(value) for value in alone]
    assert np.array_equal(table.draws(classes, permutations, ranks, key), block)  # pure


def test_permutations_and_keys_shuffle_a_class_differently() -> None:
    table = ClassTable(np.zeros(64, dtype=np.int64))
    orders = {tuple(every_draw(table, 0, permutation, key).tolist()) for permutation in range(4) for key in (1, 2)}
    assert len(orders) == 8
    assert tuple(range(64)) not in orders  # no identity
