"""A ``MixedStream`` built again over the same streams (as at every resume) hashes each stream's identity once: a
source of another seed or window, or of other shards, is still refused, naming it."""

from __future__ import annotations

import pytest

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.stream import MixedStream
from tests.stream.test_mixed_stream import COUNTS_A, COUNTS_B, MAP_SIZE, mixed, source


def test_a_source_of_another_seed_window_or_shards_is_refused_naming_it_after_the_saved_ones_were_kept() -> None:
    state = mixed().state_dict(consumed_batches=2)
    mixed().load_state_dict(state)  # the saved sources' identities are kept now
    for changed in (source(10_000, COUNTS_A, seed=3), source(10_000, COUNTS_A, window=3), source(10_000, [7, 5, 9])):
        stream = MixedStream(
            [list(range(5000, 5000 + MAP_SIZE)), changed, source(20_000, COUNTS_B)],
            [2, 1, 1], batch_size=3, num_samples=40, seed=7, on_change="continue",
        )  # fmt: skip
        with pytest.raises(IncompatibleStateError, match="source 1 changed") as error:
            stream.load_state_dict(state)
        assert error.value.field == "sources[1]"
    mixed().load_state_dict(state)  # and the saved ones still load
