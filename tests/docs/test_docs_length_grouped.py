"""The docs and examples give ``LengthGrouped`` no batch size by hand (issue 25, item 24): the sampler
passes its own global batch (``Strategy.for_sampler``), and a per-rank value passed by hand was the
silent mistake the docs used to invite."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from stateful_sampler import StatefulSampler

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.py"),
           *(ROOT / "benchmarks").glob("*.py")]  # fmt: skip


def test_no_doc_or_example_passes_length_grouped_a_batch_size() -> None:
    by_hand = [f"{path.relative_to(ROOT)}: {found.group(0)}" for path in SOURCES
               for found in re.finditer(r"LengthGrouped\([^)]*\bbatch_size\b[^)]*\)", path.read_text())]  # fmt: skip
    assert by_hand == []


def test_the_mixtures_page_example_groups_by_the_samplers_global_batch() -> None:
    page = (ROOT / "docs" / "mixtures.md").read_text()
    section = page[page.index("## `LengthGrouped(") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)  # type: ignore[union-attr]
    names = {"token_counts": np.random.default_rng(0).integers(1, 500, 1000), "data": list(range(1000)),
             "StatefulSampler": StatefulSampler}  # fmt: skip
    exec(code, names)  # noqa: S102  # the page's own example, with its two inputs defined
    sampler = names["sampler"]
    assert sampler.strategy.batch_size == 8  # 8 a rank x 1 rank
    assert sorted(sampler) == list(range(1000))
