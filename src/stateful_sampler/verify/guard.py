"""``python -m stateful_sampler.verify.guard COMMAND ...``: the first process of every run verify starts.

It becomes a child subreaper, so processes whose parent dies (a killed launcher's ranks, a killed
rank's workers) are re-parented to it and stay in the run's tree for ``kill_tree``; it watches the
lifeline, so the run dies with verify however verify ends; and it runs COMMAND, exiting with its
code. Whatever COMMAND leaves running when it ends is killed: a run never outlives itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from stateful_sampler.verify.lifeline import watch_lifeline
from stateful_sampler.verify.process_tree import descendants

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def main(command: list[str]) -> int:
    if not command:
        raise ValueError("guard needs a command to run, got none")
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    watch_lifeline()
    code = subprocess.call(command)
    for pid in descendants(os.getpid()) - {os.getpid()} if sys.platform == "linux" else ():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
