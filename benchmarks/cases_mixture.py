"""Issue 11: ``Mixture`` resume and memory at 10^9 draws against Megatron's blended-index build, and
``LengthGrouped``'s per-index cost and padding waste against HF's ``LengthGroupedSampler`` algorithm.

Each case runs in a fresh interpreter (``python -m benchmarks.cases_mixture CASE JSON``) so its peak RSS
above the post-import baseline is its own, as in ``benchmarks/child.py``.
"""

from __future__ import annotations

import json
import sys
from time import perf_counter
from typing import Any

import numpy as np

from benchmarks import isolated

SOURCES = 100
TOTAL = 10**9


def _weights() -> np.ndarray:
    return np.random.default_rng(0).random(SOURCES) + 0.01


def mixture_resume(repeats: int = 5) -> dict[str, Any]:
    """100 sources of 10^7 records, an epoch of 10^9 draws: build the sampler, then load a state at
    the epoch's middle and take the first batch of 256, best of ``repeats``."""
    from stateful_sampler import StatefulSampler
    from stateful_sampler.order.mixture import Mixture

    sizes = np.full(SOURCES, TOTAL // SOURCES)
    started = perf_counter()
    mixture = Mixture(sizes, _weights(), num_samples=TOTAL)
    build = perf_counter() - started
    saver = StatefulSampler(TOTAL, strategy=mixture, seed=7, batch_size=256)
    state = {**saver.state_dict(), "position": TOTAL // 2}
    seconds = []
    for _ in range(repeats):
        started = perf_counter()
        sampler = StatefulSampler(TOTAL, strategy=mixture, seed=7, batch_size=256)
        sampler.load_state_dict(state)
        iterator = iter(sampler)
        batch = [next(iterator) for _ in range(256)]
        seconds.append(perf_counter() - started)
    return {"seconds": min(seconds), "construction_seconds": build, "period": int(mixture._periods[0].period),
            "first": batch[0]}  # fmt: skip


def megatron_build(size: int, timed_steps: int) -> dict[str, Any]:
    """Megatron's ``build_blending_indices`` (helpers.cpp) in NumPy: at each sample, the source whose
    count lags its target most (largest error first) takes it. The loop is sequential: it is timed over
    ``timed_steps`` samples and scaled to ``size``; its two output arrays are allocated at ``size``."""
    weights = _weights() / _weights().sum()
    dataset_index = np.full(size, -1, dtype=np.int16)  # as Megatron's: int16 source, int64 sample index
    dataset_sample_index = np.full(size, -1, dtype=np.int64)  # filled, so its pages count in the RSS
    current = np.zeros(SOURCES, dtype=np.int64)
    started = perf_counter()
    for sample in range(timed_steps):
        errors = weights * max(sample, 1) - current
        source = int(np.argmax(errors))
        dataset_index[sample] = source
        dataset_sample_index[sample] = current[source]
        current[source] += 1
    seconds = perf_counter() - started
    return {"seconds": seconds * size / timed_steps, "timed_steps": timed_steps}


def hf_length_grouped(lengths: np.ndarray, batch_size: int, megabatch: int, seed: int) -> list[int]:
    """HF's ``get_length_grouped_indices``: randperm, megabatches of ``megabatch * batch_size`` sorted
    by length descending, then the longest record swapped into the first position."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    indices = torch.randperm(len(lengths), generator=generator).tolist()
    span = megabatch * batch_size
    cuts = [indices[i : i + span] for i in range(0, len(indices), span)]
    megabatches = [sorted(megabatch, key=lambda i: lengths[i], reverse=True) for megabatch in cuts]
    maximums = [lengths[m[0]] for m in megabatches]
    longest = int(np.argmax(maximums))
    megabatches[0][0], megabatches[longest][0] = megabatches[longest][0], megabatches[0][0]
    return [i for m in megabatches for i in m]


def token_lengths(size: int) -> np.ndarray:
    """Sequence lengths in tokens, log-normal (median ~150, long tail), clipped to [1, 4096]."""
    return np.clip(np.random.default_rng(1).lognormal(5.0, 0.9, size), 1, 4096).astype(np.int64)


def length_grouped(size: int, batch_size: int, megabatch: int) -> dict[str, Any]:
    """Per-index cost of one epoch (ours through the sampler, HF's list build, the uniform sampler) and
    padding waste of each order on 1 and 4 ranks."""
    from stateful_sampler import StatefulSampler
    from stateful_sampler.audit.lengths import audit_lengths
    from stateful_sampler.order.length_grouped import LengthGrouped

    lengths = token_lengths(size)
    costs: dict[str, float] = {}
    orders: dict[str, dict[int, np.ndarray]] = {}
    for ranks in (1, 4):
        # The global order of `ranks` ranks: one sampler whose batch is the global one gives LengthGrouped its size.
        strategy = LengthGrouped(lengths, megabatch=megabatch)
        started = perf_counter()
        sampler = StatefulSampler(size, strategy=strategy, seed=3, batch_size=batch_size * ranks)
        ours = np.fromiter(sampler, dtype=np.int64, count=size)
        costs.setdefault("ours", (perf_counter() - started) / size)
        started = perf_counter()
        hf = np.array(hf_length_grouped(lengths.tolist(), batch_size * ranks, megabatch, 3))
        costs.setdefault("hf", (perf_counter() - started) / size)
        orders[ranks] = {"ours": ours, "hf": hf}
    started = perf_counter()
    uniform = np.fromiter(StatefulSampler(size, seed=3), dtype=np.int64, count=size)
    costs["uniform"] = (perf_counter() - started) / size
    waste = {
        str(ranks): {name: audit_lengths(lengths, order, batch_size, ranks).padding_waste
                     for name, order in {**orders[ranks], "uniform": uniform}.items()}
        for ranks in (1, 4)
    }  # fmt: skip
    return {"seconds_per_index": costs, "padding_waste": waste}


CASES = {"mixture_resume": mixture_resume, "megatron_build": megatron_build, "length_grouped": length_grouped}


def run(name: str, **params: Any) -> dict[str, Any]:
    """One case in a fresh interpreter; adds its peak RSS above the post-import baseline."""
    return isolated.run("benchmarks.cases_mixture", name, params)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        isolated.child(CASES, sys.argv[1], json.loads(sys.argv[2]))
    else:
        print(json.dumps({name: run(name) for name in ("mixture_resume",)}, indent=1))
