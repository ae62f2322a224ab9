"""A mixture built again (a ``MixedStream`` builds one at every resume) shares what was computed before, exactly: its
quota periods while a mixture of the same weights lives, its fingerprint once per distinct identity."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler.order import quota
from stateful_sampler.order.mixture import Mixture
from stateful_sampler.order.quota import QuotaPeriod, _by_source, _midpoint_order
from stateful_sampler.order.strategy import _hashed


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=12).filter(any))
def test_the_midpoint_positions_by_source_are_the_stable_sort_of_its_order(counts: list[int]) -> None:
    """The period's table takes them from the sort's inverse, where it sorted the order again."""
    order, positions = _midpoint_order(np.array(counts, dtype=np.int64))
    assert positions.tolist() == _by_source(order).tolist()


def test_a_mixture_of_a_live_one_s_weights_shares_its_read_only_periods_and_none_is_kept_after_them() -> None:
    weights, schedule = [101, 202, 307], [307, 0, 101]  # weights no other test uses: their periods are this test's
    first = Mixture([5, 7, 9], weights, num_samples=20, schedule={1: schedule})
    again = Mixture([6, 6, 6], [2 * w for w in weights], num_samples=30)  # the same ratios
    assert again._periods[0] is first._periods[0]
    for built, counts in zip(first._periods, (weights, schedule)):
        fresh = QuotaPeriod(np.array(counts))
        assert built.sources.tobytes() == fresh.sources.tobytes() and built.draws.tobytes() == fresh.draws.tobytes()
        for array in (built.counts, built.sources, built.draws):
            with pytest.raises(ValueError, match="read-only"):
                array[0] = 1
    other = Mixture([5, 7, 9], [101, 202, 308], num_samples=20)
    assert other._periods[0] is not first._periods[0]
    keys = [np.array(counts, dtype=np.int64).tobytes() for counts in (weights, schedule)]
    assert all(key in quota._live for key in keys)
    del first, again, built  # the loop's last period too
    gc.collect()
    assert not any(key in quota._live for key in keys)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=2, max_size=8),
    num_samples=st.integers(2, 100),
    data=st.data(),
)
def test_a_kept_fingerprint_is_the_one_computed_afresh_and_another_weight_size_or_length_is_another(
    sizes: list[int], num_samples: int, data: Any
) -> None:
    count = len(sizes)
    weights = data.draw(st.lists(st.integers(1, 9), min_size=count, max_size=count))
    later = data.draw(st.lists(st.integers(0, 9), min_size=count, max_size=count).filter(any))
    schedule = {(1, data.draw(st.integers(0, num_samples - 1))): later}
    mixture = Mixture(sizes, weights, num_samples=num_samples, schedule=schedule)
    assert mixture.fingerprint() == _hashed("mixture", mixture._identity())
    assert Mixture(sizes, weights, num_samples=num_samples, schedule=schedule).fingerprint() == mixture.fingerprint()
    changes = (
        Mixture(sizes, [weights[0] + 1, *weights[1:]], num_samples=num_samples, schedule=schedule),
        Mixture([sizes[0] + 1, *sizes[1:]], weights, num_samples=num_samples, schedule=schedule),
        Mixture(sizes, weights, num_samples=num_samples + 1, schedule=schedule),
        Mixture(sizes, weights, num_samples=num_samples, schedule={(2, 0): later}),
    )
    for changed in changes:
        assert changed.fingerprint() == _hashed("mixture", changed._identity()) != mixture.fingerprint()
    continued = mixture.continued_at(num_samples + 1, np.arange(count))
    assert continued.fingerprint() == _hashed("mixture", continued._identity()) != mixture.fingerprint()
    moved = mixture.continued_at(num_samples + 1, np.arange(count) + 1)
    assert moved.fingerprint() == _hashed("mixture", moved._identity()) != continued.fingerprint()


def test_the_fingerprint_does_not_follow_the_users_print_options() -> None:
    """The fingerprint reprs nested arrays: under a user's own NumPy print options it is the one of the defaults,
    kept or not, and a precision of 2 does not make two mixtures whose weights differ in the third digit one."""
    sizes = [10] * 12
    default = Mixture(sizes, [0.501] + [0.5] * 11, num_samples=50).fingerprint()
    other = Mixture(sizes, [0.502] + [0.5] * 11, num_samples=50).fingerprint()
    assert default != other
    options = [{"linewidth": 20}, {"precision": 2}, {"formatter": {"all": lambda _: "x"}}, {"legacy": "1.13"}]
    for option in options:
        with np.printoptions(**option):
            assert Mixture(sizes, [0.501] + [0.5] * 11, num_samples=50).fingerprint() == default, option
            assert Mixture(sizes, [0.502] + [0.5] * 11, num_samples=50).fingerprint() == other, option
            fresh = Mixture(sizes, [0.503] + [0.5] * 11, num_samples=50)  # not kept yet
            assert fresh.fingerprint() == _hashed("mixture", fresh._identity())
    with np.printoptions(precision=2):
        assert fresh.fingerprint() == Mixture(sizes, [0.503] + [0.5] * 11, num_samples=50).fingerprint()
