"""A training run started by verify dies with verify, however verify ends, SIGKILL included.

verify keeps the write end of a pipe and hands the read end to the run. Nothing else holds the
write end and nothing is ever written, so the read end reports end-of-file exactly when verify is
gone. A thread of the run's first process (recorded_fit, or a command's guard) waits for that and
kills the run's whole process tree: every rank and DataLoader worker, which no handler in verify
can do after a SIGKILL.
"""

from __future__ import annotations

import os
import threading

from stateful_sampler.verify.process_tree import kill_tree

LIFELINE_ENV = "STATEFUL_SAMPLER_LIFELINE"  # descriptor number of the read end, in the run's first process


def watch_lifeline() -> None:
    """Start the watch if verify passed a lifeline. The variable is removed, so the processes this
    one starts (which do not inherit the descriptor) do not watch a number that means nothing."""
    descriptor = os.environ.pop(LIFELINE_ENV, None)
    if descriptor is not None:
        threading.Thread(target=_die_with_parent, args=(int(descriptor),), name="verify-lifeline", daemon=True).start()


def _die_with_parent(descriptor: int) -> None:
    while os.read(descriptor, 1):  # nothing is written: only end-of-file ends the wait
        pass
    kill_tree(os.getpid())
