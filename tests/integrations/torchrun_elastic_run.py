"""One worker of tests/integrations/test_torchrun_elastic.py: ``examples/torchrun_elastic.py``'s ``train``, with each
step it took appended to ROOT/steps/restart<C>-rank<R>.jsonl.

With ``ELASTIC_TEST_PAUSE_AT=K`` (and ``ELASTIC_TEST_PAUSE_LOCAL_RANK=L``: only that local rank), a
worker of the first start pauses after step K, writes its pid to ROOT/paused-<rank> and waits there
for the test to kill it: the kill lands after an exact step, without a sleep.

    torchrun ... tests/integrations/torchrun_elastic_run.py ROOT EPOCHS EVERY
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

PAUSE_AT_ENV, PAUSE_LOCAL_RANK_ENV = "ELASTIC_TEST_PAUSE_AT", "ELASTIC_TEST_PAUSE_LOCAL_RANK"
_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun_elastic.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("torchrun_elastic", _EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(root: Path, epochs: int, every: int) -> None:
    steps = root / "steps"
    steps.mkdir(parents=True, exist_ok=True)
    pause_at = int(os.environ.get(PAUSE_AT_ENV, "0")) or None
    pause_rank = os.environ.get(PAUSE_LOCAL_RANK_ENV)

    def on_step(record: dict[str, Any]) -> None:
        with (steps / f"restart{record['restart']}-rank{record['rank']}.jsonl").open("a") as out:
            out.write(json.dumps(record) + "\n")
        if record["step"] == pause_at and record["restart"] == 0 and pause_rank in (None, os.environ["LOCAL_RANK"]):
            paused = root / f"paused-{record['rank']}"
            paused.with_suffix(".tmp").write_text(str(os.getpid()))
            os.replace(paused.with_suffix(".tmp"), paused)
            threading.Event().wait(300)  # the test kills this process long before
            os._exit(3)

    _example().train(root, epochs, every, on_step)
    # The run's steps and weights are written by now. A worker restarted by the agent sometimes aborts in
    # the interpreter's teardown ("terminate called without an active exception", exit -6: a torch thread
    # left joinable), which the agent reports as a failed run: leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
