"""``python -m stateful_sampler.demo``: a plain LightningCLI for configs that name their model and
datamodule by ``class_path``, and the configs it ships.

    python -m stateful_sampler.demo --print-config > digits.yaml          # the shipped config
    python -m stateful_sampler.demo --print-config resume > resume.yaml   # ckpt_path: last
    python -m stateful_sampler.demo fit --config digits.yaml                          # a fresh run
    python -m stateful_sampler.demo fit --config digits.yaml --config resume.yaml     # resume it

The saved ``config.yaml`` is overwritten, so resuming in the same directory (adding a config with
``ckpt_path: last``) does not stop at the fresh run's copy.
"""

from __future__ import annotations

import sys

from stateful_sampler.demo import CONFIGS, shipped_config
from stateful_sampler.extras import missing_extra


def main(argv: list[str]) -> int:
    if argv[:1] == ["--print-config"]:
        if len(argv) > 2 or (len(argv) == 2 and argv[1] not in CONFIGS):
            print(f"usage: python -m stateful_sampler.demo --print-config [{'|'.join(CONFIGS)}]", file=sys.stderr)
            return 2
        sys.stdout.write(shipped_config(*argv[1:]))
        return 0
    try:
        from lightning.pytorch.cli import LightningCLI
    except ModuleNotFoundError as error:
        raise missing_extra(error, "demo", "the demo") from error
    LightningCLI(save_config_kwargs={"overwrite": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
