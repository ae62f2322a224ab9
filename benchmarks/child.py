"""Runs one case in this process and prints its result as JSON, with the peak RSS it added.

The baseline is the peak RSS after every import a case may need, so the figure is the memory
the case itself held (``ru_maxrss`` is the high-water mark, in KiB on Linux). DataLoader worker
processes are not included: the figure is the main process's.
"""

from __future__ import annotations

import json
import resource
import sys
import warnings

import torchdata.stateful_dataloader  # noqa: F401 - imported before the baseline, like the rest

from benchmarks.cases import CASES


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str]) -> int:
    name, params = argv[0], json.loads(argv[1])
    warnings.filterwarnings("ignore")  # torchdata's set_vital deprecation, once per loader
    baseline = _peak_mib()
    result = CASES[name](**params)
    result["peak_mib_above_baseline"] = _peak_mib() - baseline
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
