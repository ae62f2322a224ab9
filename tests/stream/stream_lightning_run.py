"""The stream of the Lightning fits of ``test_stream_lightning.py``, and their process:
``python -m tests.stream.stream_lightning_run ROOT WORKERS DEVICES KILL_AT`` (KILL_AT 0: no kill) runs
``stream_lightning_fit.main``; Lightning launches the DDP ranks itself (gloo, CPU).

Lightning is imported under the ``__name__`` guard only: a DataLoader worker started from a fork server runs
this module again as its ``__mp_main__``, and the test computes the order in-process, with torch alone.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from stateful_sampler.stream import ShardedStream
from tests.stream_helpers import Rows, as_tensor

COUNTS, BATCH, EPOCHS = [7, 5, 0, 9, 4, 6, 8], 2, 2  # 39 records: 10 steps an epoch on 2 ranks, 20 on 1


def make_stream(**kwargs: Any) -> ShardedStream:
    """The fits' stream; ``num_replicas`` and ``rank`` default to the process group."""
    return ShardedStream([str(i) for i in range(len(COUNTS))], Rows(COUNTS), batch_size=BATCH, window=2, seed=5,
                         transform=as_tensor, **kwargs)  # fmt: skip


if __name__ == "__main__":
    from tests.stream.stream_lightning_fit import main

    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
