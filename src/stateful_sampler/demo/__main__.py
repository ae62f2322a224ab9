"""``python -m stateful_sampler.demo``: a plain LightningCLI for configs that name their model and
datamodule by ``class_path``, and the configs it ships.

    python -m stateful_sampler.demo --shipped-config > digits.yaml          # the shipped config
    python -m stateful_sampler.demo --shipped-config resume > resume.yaml   # ckpt_path: last
    python -m stateful_sampler.demo fit --config digits.yaml                          # a fresh run
    python -m stateful_sampler.demo fit --config digits.yaml --config resume.yaml     # resume it

``--shipped-config`` prints a file that ships with the package; LightningCLI's own ``--print_config``
(``fit --config digits.yaml --print_config``) prints the whole config a run would use, resolved.
``--print-config``, the old name, still works and says so on stderr: it read too much like
LightningCLI's flag. The saved ``config.yaml`` is overwritten, so resuming in the same directory
(adding a config with ``ckpt_path: last``) does not stop at the fresh run's copy.
"""

from __future__ import annotations

import sys

from stateful_sampler.demo import CONFIGS, shipped_config
from stateful_sampler.extras import missing_extra

SHIPPED = "--shipped-config"
RENAMED = "--print-config"  # SHIPPED's name until 0.3.0


def main(argv: list[str]) -> int:
    if argv[:1] in ([SHIPPED], [RENAMED]):
        if argv[0] == RENAMED:
            print(f"note: {RENAMED} is now {SHIPPED} (LightningCLI's own --print_config prints a run's resolved "
                  "config: fit --config FILE --print_config)", file=sys.stderr)  # fmt: skip
        if len(argv) > 2 or (len(argv) == 2 and argv[1] not in CONFIGS):
            print(f"usage: python -m stateful_sampler.demo {SHIPPED} [{'|'.join(CONFIGS)}]", file=sys.stderr)
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
